"""Exports of trained models to other inference engines: CTranslate2 (`attnkit.export.ctranslate2`).

The engines themselves are optional packages, imported only when an export is written or run."""

from attnkit.export.ctranslate2 import (
    CT2Translator,
    check_export,
    export_checkpoint,
    require_ctranslate2,
    save_ctranslate2,
    transformer_spec,
)

__all__ = ["CT2Translator", "check_export", "export_checkpoint", "require_ctranslate2", "save_ctranslate2",
           "transformer_spec"]
