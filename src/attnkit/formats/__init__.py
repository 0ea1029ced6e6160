"""Models in other frameworks' formats, both ways: a Marian / Hugging Face `MarianMTModel` folder imported as an
attnkit checkpoint, and an attnkit Transformer exported as one (`attnkit.formats.marian`).

`transformers` is never imported: the files are read and written as the formats define them."""

from attnkit.formats.marian import export_marian, import_marian

__all__ = ["export_marian", "import_marian"]
