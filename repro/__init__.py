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


def _max_of(*values: object) -> int | float:
    """The largest of ``values`` (numbers or numeric text), an int when it is a whole number."""
    best = max(float(str(v)) for v in values)
    return int(best) if best.is_integer() else best


# ``${max:a,b}``: the larger of two numbers, e.g. vllm bench serve's num_prompts = max(10 C, 50)
# (``${max:${mul:10,${concurrency}},50}``).
if not OmegaConf.has_resolver("max"):
    OmegaConf.register_new_resolver("max", _max_of)


def _vllm_serve(key: str, gpu: str, memory_gib: float) -> int:
    """``vllm serve``'s default ``max_num_seqs`` or ``max_num_batched_tokens`` on that GPU
    (:func:`repro.cost.serving.vllm_serve_budgets`)."""
    from repro.cost.serving import vllm_serve_budgets

    seqs, tokens = vllm_serve_budgets(str(gpu), float(memory_gib))
    if key not in ("max_num_seqs", "max_num_batched_tokens"):
        raise ValueError(f"vllm_serve: max_num_seqs or max_num_batched_tokens, not {key!r}")
    return seqs if key == "max_num_seqs" else tokens


# ``${vllm_serve:max_num_seqs,${hardware.name},${hardware.memory_gb}}``: vLLM V1's API-server default on the run's GPU
if not OmegaConf.has_resolver("vllm_serve"):
    OmegaConf.register_new_resolver("vllm_serve", _vllm_serve)


def _remember_parses() -> None:
    """Parse each interpolation's text once per process.

    OmegaConf 2.3 parses an interpolation's text (``${mul:${load_scale},21.067}``) every time it resolves it: about
    250 µs each, half the time of resolving a composed point's config, which every point of a sweep repeats.
    The parse tree is not changed by resolving it (OmegaConf's visitor reads it), so one tree per distinct text
    serves every resolution. Only OmegaConf 2.3 is patched (its ``base`` module calls ``grammar_parser.parse``); a
    parse error is not cached and raises as before."""
    import functools

    import omegaconf
    from omegaconf import base, grammar_parser

    if omegaconf.__version__.startswith("2.3.") and getattr(base, "parse", None) is grammar_parser.parse:
        base.parse = functools.lru_cache(maxsize=4096)(grammar_parser.parse)


_remember_parses()
