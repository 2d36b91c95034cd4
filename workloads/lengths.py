"""Prompt and output lengths of a workload's requests, per dataset (step 4 of :mod:`workloads.build`).

Real records are shuffled and cycled when more are needed (like vLLM's sampling without replacement); without the
file, the embedded quantile table (:mod:`workloads.stats`), else published or assumed mean ± std. Missing reference
outputs are drawn from the ShareGPT output-length table (or fixed by ``output_len``); ``max_model_len`` filters
(redraws) or truncates. ShareGPT with ``sampler: vllm_benchmark`` follows vLLM's ``benchmark_serving.py`` instead
(its order and pruning, and an EOS model: :meth:`LengthDrawer._vllm_benchmark`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from workloads.datasets import (
    DataMissingError,
    LengthRecords,
    check_dataset,
    find_user_path,
    load_records,
    vllm_benchmark_pool,
    vllm_sharegpt_keep,
)
from workloads.provenance import DataSource, show_path
from workloads.sonnet import SonnetLines, load_sonnet_lines, sample_sonnet
from workloads.spec import DatasetSpec, WorkloadSpec
from workloads.stats import (
    ASSUMED,
    PUBLISHED,
    QUANTILES,
    find_table,
    sample_assumed,
    sample_output_marginal,
    sample_published,
    sample_table,
)

_MAX_REDRAWS = 200


def _with_records(draw: Any) -> Any:
    """A length drawer that also returns each draw's record (-1: none, for drawers without records)."""
    def wrapped(k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        out = draw(k)
        return (out[0], out[1], out[2]) if len(out) == 3 else (out[0], out[1], np.full(k, -1, dtype=np.int64))

    return wrapped


class LengthDrawer:
    """One build's state for drawing lengths (data root, tokenizer, ``max_model_len``, generator) and the notes of
    every data source the build used (:meth:`record`)."""

    def __init__(
        self,
        spec: WorkloadSpec,
        root: Path | None,
        tokenizer: str | None,
        max_model_len: int | None,
        rng: np.random.Generator,
    ) -> None:
        self.spec, self.root, self.tokenizer = spec, root, tokenizer
        self.max_model_len, self.rng = max_model_len, rng
        self.notes: list[str] = []
        self.provenance: list[DataSource] = []
        self.sources: dict[str, LengthRecords] = {}  # dataset key -> the records its requests' prompts come from
        self._benchmark: dict[DatasetSpec, Any] = {}  # sampler vllm_benchmark: one drawer (one sequence) per entry

    def record(self, dataset: str, kind: str, fallback: bool, detail: str, role: str = "lengths") -> None:
        """Record a data source and its note (each once)."""
        src = DataSource(dataset, kind, fallback, detail, role)
        if src not in self.provenance:
            self.provenance.append(src)
        if detail not in self.notes:
            self.notes.append(detail)

    def fit(
        self, p: np.ndarray, o: np.ndarray, drop: bool = False
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Apply ``max_model_len``: truncate, or return a keep-mask (``drop``) of requests that fit."""
        ok = np.ones(len(p), dtype=bool)
        if self.max_model_len is None:
            return p, o, ok
        if self.spec.overlength == "truncate":
            p = np.minimum(p, self.max_model_len - 1)
            return p, np.maximum(1, np.minimum(o, self.max_model_len - p)), ok
        return p, o, (p + o <= self.max_model_len) if drop else ok

    def sample(self, ds: DatasetSpec, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` (prompt, output) lengths of dataset ``ds``, honouring ``max_model_len``."""
        p, o, _ = self.sample_records(ds, n)
        return p, o

    def sample_records(self, ds: DatasetSpec, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`sample`, and each request's record of the dataset's file (-1 where its lengths come from no
        record: tables, fixed or assumed lengths); the records are in :attr:`sources` under ``ds.key``."""
        draw = _with_records(self._drawer(ds))
        if self.spec.output_to_max_len:
            draw = self._to_max_len(ds, draw)
        p, o, rec = draw(n)
        p, o, _ = self.fit(p, o)
        if self.max_model_len is not None and self.spec.overlength == "filter":
            for _ in range(_MAX_REDRAWS):
                bad = np.flatnonzero(p + o > self.max_model_len)
                if not len(bad):
                    break
                p[bad], o[bad], rec[bad] = draw(len(bad))
            else:
                raise ValueError(
                    f"dataset {ds.name}: cannot draw requests within max_model_len={self.max_model_len}"
                )
        return p, o, rec

    def spans(self, ds: DatasetSpec, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, str | None, str | None]:
        """``n`` requests of an acceptance-span file (dataset ``spans``, ``ds.path``): prompt and output lengths
        (output = the shortest of the record's output and its span lists), each one's record index and the file
        (its path and how notes show it). Records are shuffled and taken in order (vLLM samples without
        replacement), cycled when more are needed. Without the file (source auto / embedded), lengths come from the
        embedded table ``workloads/stats/<label>.native.csv`` and no request has a record (-1)."""
        from repro.oracle.spans import read_span_file

        assert ds.path is not None
        source = self._source(ds)
        found: tuple[Path, str] | None = None
        if source != "embedded":
            try:
                found = find_user_path(ds.path, self.root, f"dataset {ds.key}: acceptance-span file")
            except DataMissingError:
                if source == "real":
                    raise
        if found is None:
            table = find_table(ds.key, None)
            if table is None:
                raise DataMissingError(f"dataset {ds.key}: acceptance-span file {ds.path} not found (nor under "
                                       f"{self.root or '$REPRO_DATA'}) and no embedded table "
                                       f"workloads/stats/{ds.key}.native.csv: provide the file (docs/data.md)")
            self.record(ds.key, "embedded", source != "embedded",
                        f"{ds.key}: embedded quantile table {Path(table.path).name} ({table.num_records} records; "
                        f"no span file {ds.path}), Gaussian copula rho={table.rho:.2f}")
            p, o = sample_table(table, n, self.rng)
            if ds.output_len is not None:
                o = np.full(n, ds.output_len, dtype=np.int64)
            if ds.prompt_mean is not None:  # the table's mean: its quantile function averaged (trapezoids)
                p = self._rescale(ds, p, float(np.mean((table.prompt_q[1:] + table.prompt_q[:-1]) / 2.0)))
            p, o, _ = self.fit(p, o)
            return p, o, np.full(n, -1, dtype=np.int64), None, None
        path, shown = found
        try:
            f = read_span_file(str(path), None, shown)
        except (FileNotFoundError, ValueError) as exc:
            raise DataMissingError(str(exc)) from None
        pool = np.arange(f.prompt_len.size)
        prompt_len = f.prompt_len
        if ds.prompt_mean is not None:
            prompt_len = self._rescale(ds, prompt_len, float(prompt_len.mean()))
        out_len = f.output_len if ds.output_len is None else np.full(f.output_len.size, ds.output_len, dtype=np.int64)
        if self.max_model_len is not None:
            pool = pool[prompt_len[pool] + out_len[pool] <= self.max_model_len]
        if not pool.size:
            raise ValueError(f"dataset {ds.key}: no record of {shown} fits max_model_len={self.max_model_len}")
        take = np.concatenate([self.rng.permutation(pool) for _ in range(-(-n // pool.size))])[:n]
        self.record(ds.key, "file", False, f"{ds.key}: acceptance-span file {shown} ({f.prompt_len.size} records, "
                    f"{pool.size} within max_model_len; output = the shortest of the recorded output and its span "
                    "lists)")
        return prompt_len[take].copy(), out_len[take].copy(), take.astype(np.int64), str(path), shown

    def _rescale(self, ds: DatasetSpec, p: np.ndarray, source_mean: float) -> np.ndarray:
        """Prompt lengths ``p`` times ``ds.prompt_mean`` / ``source_mean`` (rounded, at least 1), said in the notes."""
        assert ds.prompt_mean is not None
        factor = float(ds.prompt_mean) / source_mean
        note = (f"{ds.key}: prompt lengths rescaled x{factor:.4f} (source mean {source_mean:.1f} -> "
                f"{float(ds.prompt_mean):g} tokens, the dataset's prompt_mean)")
        if note not in self.notes:
            self.notes.append(note)
        return np.maximum(1, np.rint(np.asarray(p, dtype=np.float64) * factor)).astype(np.int64)

    def _to_max_len(self, ds: DatasetSpec, draw: Any) -> Any:
        """``draw`` with every output running to ``max_model_len`` (``output_to_max_len``): a prompt that leaves
        no room for one output token is redrawn (``overlength: filter``) or cut to ``max_model_len`` − 1."""
        mml = self.max_model_len
        if mml is None:
            raise ValueError("output_to_max_len needs a max_model_len (engine.max_model_len or the model's context)")
        self.record(ds.key, "fixed", False, f"{ds.key}: outputs run to max_model_len = {mml} (prompt + output)")

        def to_max(k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            p, _, rec = draw(k)
            p = np.asarray(p, dtype=np.int64).copy()
            for _ in range(_MAX_REDRAWS):
                bad = np.flatnonzero(p >= mml)
                if not len(bad) or self.spec.overlength == "truncate":
                    break
                redrawn = draw(len(bad))
                p[bad], rec[bad] = np.asarray(redrawn[0], dtype=np.int64), redrawn[2]
            else:
                raise ValueError(f"dataset {ds.name}: no prompt shorter than max_model_len={mml}")
            p = np.minimum(p, mml - 1)
            return p, mml - p, rec

        return to_max

    def _source(self, ds: DatasetSpec) -> str:
        return ds.source or self.spec.source

    def _drawer(self, ds: DatasetSpec) -> Any:
        if ds.name == "fixed":
            self.record(ds.key, "fixed", False, f"fixed: {ds.input_len}/{ds.output_len} tokens")
            return lambda k: (np.full(k, ds.input_len, np.int64), np.full(k, ds.output_len, np.int64))
        if ds.name == "hf":
            from workloads.hf import load_hf_records

            return self._real(ds, load_hf_records(ds, self.root, self.tokenizer))
        source = self._source(ds)
        if ds.sampler == "vllm_benchmark":
            if ds not in self._benchmark:
                self._benchmark[ds] = self._vllm_benchmark(ds, source)
            return self._benchmark[ds]
        if source == "published":
            return self._published(ds, fallback=False)
        if ds.name == "sonnet":
            return self._sonnet(ds, source)
        if source in ("auto", "real"):
            try:
                if self.root is None:
                    raise DataMissingError("no data folder: set $REPRO_DATA")
                return self._real(ds, load_records(ds.name, str(self.root), self.tokenizer, ds.variant))
            except DataMissingError:
                if source == "real":
                    raise
        return self._embedded(ds)

    def _real(self, ds: DatasetSpec, rec: LengthRecords) -> Any:
        p, o = rec.prompt_len, rec.output_len
        if ds.output_len is not None:
            o = np.full(len(p), ds.output_len, dtype=np.int64)
        pool = np.arange(len(p))
        prune = ds.prune if ds.prune is not None else ds.name == "sharegpt"
        if prune:
            known = o >= 0
            keep = np.where(known, vllm_sharegpt_keep(p, np.where(known, o, 4), ds.output_len), p >= 4)
            keep &= np.where(known, True, p <= 1024)
            pool = pool[keep]
        if self.max_model_len is not None and self.spec.overlength == "filter":
            pool = pool[p[pool] + np.maximum(o[pool], 1) <= self.max_model_len]
        if not len(pool):
            raise ValueError(f"dataset {ds.name}: no record survives pruning / max_model_len")
        pruned = f", {len(pool)} kept after pruning" if len(pool) < len(p) else ""
        fill = self._output_filler(ds, o)
        self.record(ds.key, "file", rec.fallback, f"{ds.key}: {rec.source}{pruned}{fill[1]}")
        self.sources[ds.key] = rec
        state = {"perm": np.zeros(0, dtype=np.int64)}

        def draw(k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            # Shuffle and take in order (vLLM samples without replacement); reshuffle when exhausted.
            while len(state["perm"]) < k:
                state["perm"] = np.concatenate([state["perm"], self.rng.permutation(pool)])
            take, state["perm"] = state["perm"][:k], state["perm"][k:]
            return p[take].copy(), fill[0](o[take].copy()), take.astype(np.int64)

        return draw

    def _vllm_benchmark(self, ds: DatasetSpec, source: str) -> Any:
        """Drawer of ShareGPT requests as vLLM's 0.6-era ``benchmark_serving.py`` sends them (``sampler:
        vllm_benchmark``; the model in :class:`~workloads.spec.DatasetSpec`'s docstring): the variant's file when
        there is one (``source`` auto | real), else its embedded table."""
        if source == "published":
            raise ValueError("dataset sharegpt: sampler vllm_benchmark reads the file or its embedded table, not "
                             "published means (source: auto | real | embedded)")
        if source in ("auto", "real"):
            try:
                if self.root is None:
                    raise DataMissingError("no data folder: set $REPRO_DATA")
                rec = load_records(ds.name, str(self.root), self.tokenizer, ds.variant)
            except DataMissingError:
                if source == "real":
                    raise
            else:
                return self._vllm_benchmark_file(ds, rec)
        return self._vllm_benchmark_embedded(ds, fallback=source != "embedded")

    def _vllm_benchmark_file(self, ds: DatasetSpec, rec: LengthRecords) -> Any:
        """vLLM's requests from the file's records: :func:`~workloads.datasets.vllm_benchmark_pool`'s order, taken in
        turn (cycled), output = min(max_tokens, L) with L drawn once per record."""
        p, ref = rec.prompt_len, rec.output_len
        if (ref < 0).any():
            raise ValueError(f"dataset {ds.key}: sampler vllm_benchmark needs reference replies; {rec.source} has "
                             f"{int((ref < 0).sum())} records without one")
        max_tokens = ref if ds.output_len is None else np.full(p.size, ds.output_len, dtype=np.int64)
        pool = vllm_benchmark_pool(p, ref, ds.output_len)
        kept = pool.size
        replies = ref[vllm_sharegpt_keep(p, ref, None)]  # the pruned reference-reply lengths: L's distribution
        if self.max_model_len is not None and self.spec.overlength == "filter":  # vLLM's server would refuse these
            pool = pool[p[pool] + max_tokens[pool] <= self.max_model_len]
        if not pool.size or not replies.size:
            raise ValueError(f"dataset {ds.key}: no record of {rec.source} survives vLLM's pruning / max_model_len")
        eos = replies[self.rng.integers(0, replies.size, size=pool.size)]
        out = np.minimum(max_tokens[pool], eos)
        fit = f", {pool.size} within max_model_len" if pool.size < kept else ""
        cap = "the reference reply" if ds.output_len is None else f"output_len {ds.output_len}"
        self.record(ds.key, "file", rec.fallback,
                    f"{ds.key}: {rec.source}, vLLM benchmark_serving.py sampler (random.seed(0) shuffle, "
                    f"{kept} kept after pruning{fit}, taken in that order); EOS model: output = min(max_tokens = "
                    f"{cap}, L), L drawn from the {replies.size} pruned reference reply lengths, one per record")
        self.sources[ds.key] = rec
        state = {"next": 0, "said": False}

        def draw(k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            at = (state["next"] + np.arange(k)) % pool.size
            state["next"] += k
            if state["next"] > pool.size and not state["said"]:
                state["said"] = True
                self.notes.append(f"{ds.key}: more requests than the {pool.size} records vLLM's sampler keeps: "
                                  "cycled in the same order (records repeat)")
            return p[pool[at]].copy(), out[at].copy(), pool[at].astype(np.int64)

        return draw

    def _vllm_benchmark_embedded(self, ds: DatasetSpec, fallback: bool) -> Any:
        """vLLM's requests without the file: i.i.d. pairs of the variant's embedded table, pruned by rejection; L is
        the reference length of a second, independent pruned pair."""
        stem = {"tokens_long": "sharegpt_tokens_long", "tokens_all": "sharegpt_tokens_all"}.get(ds.variant,
                                                                                              "sharegpt")
        table = find_table(stem, self.tokenizer)
        if table is None:
            raise DataMissingError(f"dataset {ds.key}: no file under {self.root or '$REPRO_DATA'} and no embedded "
                                   f"table workloads/stats/{stem}.<tokenizer>.csv (docs/data.md)")
        stands = f" standing in for variant {ds.variant}" if ds.variant == "v3_full" else ""
        cap = "the reference reply" if ds.output_len is None else f"output_len {ds.output_len}"
        self.record(ds.key, "embedded", fallback,
                    f"{ds.key}: embedded quantile table {Path(table.path).name}{stands} ({table.num_records} "
                    f"records, {table.tokenizer} tokens, Gaussian copula rho={table.rho:.2f}), vLLM "
                    f"benchmark_serving.py sampler without its file (i.i.d. pairs, vLLM's pruning by rejection); "
                    f"EOS model: output = min(max_tokens = {cap}, L), L the reference length of an independent "
                    "pruned pair")

        def pairs(k: int, fixed: int | None) -> tuple[np.ndarray, np.ndarray]:
            p, o = sample_table(table, k, self.rng)
            if fixed is not None:
                o = np.full(k, fixed, dtype=np.int64)
            for _ in range(_MAX_REDRAWS):
                bad = np.flatnonzero(~vllm_sharegpt_keep(p, o, fixed))
                if not bad.size:
                    return p, o
                p[bad], o2 = sample_table(table, bad.size, self.rng)
                o[bad] = o2 if fixed is None else fixed
            raise ValueError(f"dataset {ds.key}: {Path(table.path).name} yields no pair vLLM's pruning keeps")

        def draw(k: int) -> tuple[np.ndarray, np.ndarray]:
            p, max_tokens = pairs(k, ds.output_len)
            _, eos = pairs(k, None)
            return p, np.minimum(max_tokens, eos)

        return draw

    def _output_filler(self, ds: DatasetSpec, o: np.ndarray) -> tuple[Any, str]:
        """Function replacing -1 outputs by draws from the ShareGPT output table, and a note."""
        if (o >= 0).all():
            return (lambda x: x), ""
        table = find_table("sharegpt", self.tokenizer)
        if table is None:
            raise ValueError(f"dataset {ds.name} has no reference outputs and no sharegpt table to fill them")

        def fill(x: np.ndarray) -> np.ndarray:
            miss = x < 0
            x[miss] = sample_output_marginal(table, int(miss.sum()), self.rng)
            return x

        return fill, f"; missing outputs from the embedded sharegpt output table ({table.tokenizer})"

    def _embedded(self, ds: DatasetSpec) -> Any:
        check_dataset(ds.name)
        fallback = self._source(ds) != "embedded"  # auto with the file missing
        table = find_table(ds.name, self.tokenizer)
        if table is None:
            if ds.name in PUBLISHED:
                return self._published(ds, fallback)
            if ds.name in ASSUMED:
                return self._assumed(ds, fallback)
            raise DataMissingError(f"dataset {ds.name}: no real file under {self.root} and no embedded table")
        fill = self._output_filler(ds, table.output_q)
        self.record(
            ds.key,
            "embedded",
            fallback,
            f"{ds.key}: embedded quantile table {Path(table.path).name} ({table.num_records} records, "
            f"{table.tokenizer} tokens, Gaussian copula rho={table.rho:.2f}){fill[1]}",
        )
        prune = ds.prune if ds.prune is not None else ds.name == "sharegpt"

        def draw(k: int) -> tuple[np.ndarray, np.ndarray]:
            p, o = sample_table(table, k, self.rng)
            if ds.output_len is not None:
                o = np.full(k, ds.output_len, dtype=np.int64)
            o = fill[0](o)
            if prune:  # vLLM's pruning, by rejection
                for _ in range(_MAX_REDRAWS):
                    bad = np.flatnonzero(~vllm_sharegpt_keep(p, o, ds.output_len))
                    if not len(bad):
                        break
                    p[bad], o2 = sample_table(table, len(bad), self.rng)
                    o[bad] = ds.output_len if ds.output_len is not None else fill[0](o2)
            return p, o

        return draw

    def _published(self, ds: DatasetSpec, fallback: bool) -> Any:
        return self._gamma(ds, lambda k: sample_published(ds.name, ds.published_target, k, self.rng),
                           f"published mean±std (TurboSpec Table 2, target {ds.published_target}), Gamma marginals",
                           "published", fallback)

    def _assumed(self, ds: DatasetSpec, fallback: bool) -> Any:
        (pm, ps), (om, os_) = ASSUMED[ds.name]
        why = "no file under $REPRO_DATA" if fallback else "no embedded table"
        return self._gamma(ds, lambda k: sample_assumed(ds.name, k, self.rng),
                           f"{why} and no published lengths; ASSUMED prompt {pm:.0f}±{ps:.0f}, output "
                           f"{om:.0f}±{os_:.0f} tokens (workloads/stats.py), Gamma marginals", "assumed", fallback)

    def _gamma(self, ds: DatasetSpec, sample: Any, how: str, kind: str, fallback: bool) -> Any:
        """Drawer of lengths from mean ± std statistics (``sample(k)``), a fixed output length overriding."""
        self.record(ds.key, kind, fallback, f"{ds.key}: {how}")

        def draw(k: int) -> tuple[np.ndarray, np.ndarray]:
            p, o = sample(k)
            if ds.output_len is not None:
                o = np.full(k, ds.output_len, dtype=np.int64)
            return p, o

        return draw

    def _sonnet(self, ds: DatasetSpec, source: str) -> Any:
        lines: SonnetLines | None = None
        if (
            source in ("auto", "real")
            and self.root is not None
            and (self.root / "sonnet/sonnet.txt").is_file()
        ):
            path = self.root / "sonnet/sonnet.txt"
            lines = load_sonnet_lines(str(path), self.tokenizer)
            self.record(ds.key, "file", lines.fallback, f"sonnet: real file {show_path(path, self.root)} "
                        f"({len(lines.line_tokens)} lines, {lines.how}), vLLM sampler")
        elif source == "real":
            raise DataMissingError(
                f"dataset file missing: provide {self.root or '$REPRO_DATA'}/sonnet/sonnet.txt"
            )
        else:
            table = find_table("sonnet", self.tokenizer)
            if table is None:
                return self._published(ds, fallback=source != "embedded")
            num = int(table.get("num_lines", "518"))
            synth = np.rint(np.interp((np.arange(num) + 0.5) / num, QUANTILES, table.prompt_q)).astype(
                np.int64
            )
            synth = synth[
                np.random.default_rng(0).permutation(num)
            ]  # fixed order, not sorted (shared prefix)
            lines = SonnetLines(synth, int(table.get("base_prompt_tokens", "20")), table.tokenizer)
            self.record(
                ds.key,
                "embedded",
                source != "embedded",
                f"sonnet: embedded line-length table {Path(table.path).name} ({table.tokenizer}), vLLM sampler",
            )
        kw = {
            "input_len": ds.input_len or 550,
            "prefix_len": ds.prefix_len or 200,
            "output_len": ds.output_len or 150,
        }
        return lambda k: sample_sonnet(lines, k, self.rng, **kw)
