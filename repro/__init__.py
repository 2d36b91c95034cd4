"""specrepro: reproduce speculative-decoding LLM-serving papers on a calibrated serving simulator."""

from __future__ import annotations

from omegaconf import OmegaConf

# ``${mul:a,b}`` in configs: a product of two numbers (e.g. a request rate scaled for a system that runs on several
# nodes). Registered once when the package is imported, in every process that composes configs.
if not OmegaConf.has_resolver("mul"):
    OmegaConf.register_new_resolver("mul", lambda a, b: float(a) * float(b))
# ``${eq:a,b}``: whether two values are equal as text (a boolean setting read from a named choice, e.g.
# ``workload.output_to_max_len: ${eq:${outputs},max_model_len}``).
if not OmegaConf.has_resolver("eq"):
    OmegaConf.register_new_resolver("eq", lambda a, b: str(a) == str(b))
