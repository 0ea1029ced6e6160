"""The HTTP translation service: `create_app(translator)` for an ASGI app, `serve(checkpoint)` to run it."""

from attnkit.serve.app import ApiError, create_app, serve
from attnkit.serve.batcher import Batcher
from attnkit.serve.http import Busy
from attnkit.serve.schema import Limits, TranslateRequest, TranslateResponse

__all__ = ["ApiError", "Batcher", "Busy", "Limits", "TranslateRequest", "TranslateResponse", "create_app", "serve"]
