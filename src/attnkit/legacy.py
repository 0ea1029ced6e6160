"""What older versions of attnkit wrote into a Transformer's config, and the variant it spells now.

Before the variants were small subclasses of the Transformer (attnkit.models.transformer, `model.variant`), the
parts of the paper's layer were switches in its config. A checkpoint or a run folder written then still loads:
`variant_from_switches` turns the switches into the variant they spell (Kyubyong Park's is four switches set
together), and refuses in one line settings that no variant holds. tests/test_parts.py and tests/test_kyubyong.py
load such configs.
"""

from __future__ import annotations

from attnkit.errors import ConfigError

# Each switch with the paper's value, and the variant each other setting of them spells
SWITCHES = {"output_projection": True, "sublayer_dropout": True, "layer_norm_eps": 1e-5, "zero_pad_positions": False,
            "residual": True, "ffn": True, "scale_scores": True, "shared_qk": False, "norm": "layer"}
SWITCHED = {"no-residual": {"residual": False}, "no-ffn": {"ffn": False}, "no-wo": {"output_projection": False},
            "shared-qk": {"shared_qk": True}, "no-scale": {"scale_scores": False}, "batch-norm": {"norm": "batch"},
            "kyubyong": {"output_projection": False, "sublayer_dropout": False, "layer_norm_eps": 1e-8,
                         "zero_pad_positions": True}}


def variant_from_switches(model: dict) -> dict:
    """A config's model section with an older version's switches replaced by the `variant` they spell."""
    if not SWITCHES.keys() & model.keys():
        return model
    model = dict(model)
    switches = {name: model.pop(name) for name in SWITCHES.keys() & model.keys()}
    changed = {name: value for name, value in switches.items() if value != SWITCHES[name]}
    if not changed:
        return model
    variant = next((v for v, settings in SWITCHED.items() if settings == changed), None)
    if variant is None or model.get("variant", "paper") not in ("paper", variant):
        settings = ", ".join(f"model.{name}: {value}" for name, value in sorted(changed.items()))
        raise ConfigError(f"{settings}: no model.variant holds these settings together (variants: paper, "
                          f"{', '.join(SWITCHED)})")
    return model | {"variant": variant}
