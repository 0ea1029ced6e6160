"""Every format attnkit reads or writes besides its own checkpoints.

- Marian / Hugging Face `MarianMTModel` folders: imported as an attnkit checkpoint and an attnkit Transformer
  exported as one (`attnkit.formats.marian`); Marian's own model folders (the Bergamot / Firefox models, SSRU
  decoders) imported as well (`attnkit.formats.marian_bergamot`).
- Transformer-XL language models of the reference code, NVIDIA's and Hugging Face's: imported
  (`attnkit.formats.transformer_xl`).
- fairseq's Transformer translation models: imported (`attnkit.formats.fairseq`).
- Marian's own model files (`.npz`, and the `.bin` of `marian-conv` with its intgemm8 weights, as the Bergamot models
  ship) read as tensors with their model.yml (`attnkit.formats.marian_native`), and Marian's binary lexical
  shortlists (`attnkit.formats.marian_shortlist`).
- CTranslate2: an attnkit Transformer exported as a CTranslate2 model (`attnkit.formats.ctranslate2`) and
  translated with as `attnkit.decode.Translator` does (`CT2Translator`, `attnkit.formats.ct2_translator`).

The files are read by `attnkit.formats.folder` (pickles only when trusted, weights-only). `transformers` is never
imported: the files are read and written as the formats define them. `ctranslate2` is an optional package, imported
only when an export is written or run."""

from attnkit.formats.ct2_translator import CT2Translator, check_export, require_ctranslate2
from attnkit.formats.ctranslate2 import export_checkpoint, save_ctranslate2, transformer_spec
from attnkit.formats.fairseq import import_fairseq
from attnkit.formats.marian import export_marian, import_marian
from attnkit.formats.transformer_xl import import_transformer_xl

__all__ = ["CT2Translator", "check_export", "export_checkpoint", "export_marian", "import_fairseq", "import_marian",
           "import_transformer_xl", "require_ctranslate2", "save_ctranslate2", "transformer_spec"]
