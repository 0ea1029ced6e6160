"""Models in other frameworks' formats: a Marian / Hugging Face `MarianMTModel` folder imported as an attnkit
checkpoint and an attnkit Transformer exported as one (`attnkit.formats.marian`); Transformer-XL language models of
the reference code, NVIDIA's and Hugging Face's imported (`attnkit.formats.transformer_xl`); fairseq's Transformer
translation models imported (`attnkit.formats.fairseq`). The files are read by
`attnkit.formats.folder` (pickles only when trusted, weights-only).

`transformers` is never imported: the files are read and written as the formats define them."""

from attnkit.formats.fairseq import import_fairseq
from attnkit.formats.marian import export_marian, import_marian
from attnkit.formats.transformer_xl import import_transformer_xl

__all__ = ["export_marian", "import_fairseq", "import_marian", "import_transformer_xl"]
