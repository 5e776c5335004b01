"""What TOPLOC proofs cost and what `genesys validate` catches, on the same rows.

Times `genesys generate` of the same tasks without proofs, with TOPLOC proofs only
(`--no-sampling-proofs`) and with `--proofs` (TOPLOC and sampling proofs: the seeded sampler), in
alternating rounds, then `genesys validate` (transformers) of the rows with proofs: prints each
proof's cost in generation throughput and the validation time relative to generation (target: under
10%). With the transformers backend the times
are CPU seconds of this process; with `--backend vllm` (two engines kept running, one writing
proofs) or `--validate-backend vllm` they are wall-clock seconds, as the engines compute in
processes of their own. Then validates tampered rows (another
model, perturbed weights, a swapped token, another row's proofs, edited logprobs, a teacher-forced
completion; each claiming the expected model) and prints, per case, how many rows were rejected and
by which check, with the errors measured next to the honest rows' worst: the thresholds' margins.
The sampling margin of a row is its largest (`genesys.proofs.sampling`); the honest rows' spread of
them is printed too.

    python benchmarks/validate_cost.py                     # stand-in tiny model (hidden 64), CPU
    python benchmarks/validate_cost.py --hidden 512 --layers 4 --heads 8 --topk 128 --chunk 32 --max-tokens 128 \
        --max-exp 38 --max-mean 10 --max-median 8             # the TOPLOC paper's thresholds
    python benchmarks/validate_cost.py --gen-dtype bfloat16   # bf16 proofs, logprobs and sampling, fp32 validator
    python benchmarks/validate_cost.py --backend vllm --hidden 128 --heads 2   # vLLM (a head dim of 64 at least on CPU)
    python benchmarks/validate_cost.py --backend vllm --validate-backend vllm --hidden 128 --heads 2
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from genesys.testing.tampering import TINY_THRESHOLDS

# What `timed` measures: CPU seconds of this process (all threads), as on a shared machine wall time
# measures the neighbours as much as the code; wall-clock seconds where the work runs elsewhere (vLLM).
CLOCK = time.process_time
FORCED = "The answer is \\boxed{5}."  # the completion a worker hands in without sampling it


def timed(function: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """The result and the seconds of CLOCK it took."""
    started = CLOCK()
    result = function(*args, **kwargs)
    return result, CLOCK() - started


def vllm_engine(model: str, args: argparse.Namespace, proofs: Any) -> Any:
    """A vLLM engine for `model` (float32 unless --gen-dtype), writing proofs when given them."""
    from genesys.config import PromptStyle
    from genesys.generate.vllm import VLLMBackend

    engine_args = {
        "dtype": args.gen_dtype or "float32",
        "max_model_len": 1024,
        "kv_cache_memory_bytes": 256 << 20,
    }
    return VLLMBackend(model, PromptStyle(), batch_size=args.tasks, proofs=proofs, engine_args=engine_args)


def validate(
    rows: list[dict[str, Any]], work: Path, name: str, args: argparse.Namespace, model: str
) -> tuple[list[dict[str, Any]], float]:
    """`rows` validated against `model` (a fresh output); the rows and the CPU seconds it took (model load included)."""
    import orjson

    from genesys.config import ProofPolicy, ProofThresholds, ValidateCommand
    from genesys.proofs.validate import validate_files
    from genesys.testing.tampering import read_rows

    source = work / f"{name}.jsonl"
    source.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    output = work / f"{name}-validated.jsonl"
    thresholds = ProofThresholds(
        args.max_exp, args.max_mean, args.max_median, args.logprob_tolerance, args.sampling_margin
    )
    config = ValidateCommand(
        inputs=[str(source)],
        model=model,
        output=str(output),
        progress=False,
        proofs=ProofPolicy(topk=args.topk, decode_batching_size=args.chunk),
        thresholds=thresholds,
        **validator_settings(args, batch_size=args.validate_batch_size),
    )
    _, seconds = timed(validate_files, config)
    return read_rows(output), seconds


def load_validator(args: argparse.Namespace, model: str) -> None:
    """What a validation run does before its first row: load the model and hash its weights (and close it)."""
    from genesys.config import ProofPolicy, ValidateCommand
    from genesys.proofs.validate import Validator

    Validator(
        ValidateCommand(
            inputs=["-"],
            model=model,
            output="-",
            proofs=ProofPolicy(topk=args.topk, decode_batching_size=args.chunk),
            **validator_settings(args),
        )
    ).model.close()


def validator_settings(args: argparse.Namespace, batch_size: int | None = None) -> dict[str, Any]:
    """The ValidateCommand settings of the validating backend."""
    from genesys.config import BackendOptions

    if args.validate_backend == "vllm":
        engine_args = {"max_model_len": 1024, "kv_cache_memory_bytes": 256 << 20}
        return {"backend": "vllm", "backend_options": BackendOptions(batch_size=batch_size, args=engine_args)}
    return {
        "backend": "transformers",
        "backend_options": BackendOptions(batch_size=batch_size, device=args.device),
    }


def as_bf16_checkpoint(path: str) -> None:
    """Rewrite the checkpoint at `path` with bfloat16 weights."""
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(path, dtype="bfloat16").save_pretrained(path)


def worst(rows: list[dict[str, Any]], key: str, pick: Any) -> float:
    values = [
        row["toploc_errors"][key] for row in rows if row.get("toploc_errors") and key in row["toploc_errors"]
    ]
    return pick(values) if values else float("nan")


def report_case(name: str, rows: list[dict[str, Any]], honest: bool) -> None:
    """One line: rows rejected (by the proofs, the logprobs, the sampling proofs) and the errors
    (worst if honest, least if tampered)."""
    pick = max if honest else min
    rejected = sum(row["toploc_valid"] is False for row in rows)
    by = [sum(check in (row["toploc_problems"] or ()) for row in rows) for check in CHECKS]
    print(
        f"{name:<26} {len(rows):>4} {rejected:>8} {by[0]:>8} {by[1]:>8} {by[2]:>8}"
        f" {worst(rows, 'max_exp_mismatches', pick):>6.0f} {worst(rows, 'max_mant_err_mean', pick):>6.2f}"
        f" {worst(rows, 'max_mant_err_median', pick):>6.1f} {worst(rows, 'max_logprob_diff', pick):>9.3g}"
        f" {worst(rows, 'max_sampling_margin', pick):>9.3g}"
    )


CHECKS = ("proof", "logprobs", "sampling_proof")


def report_margins(rows: list[dict[str, Any]]) -> None:
    """The honest rows' largest sampling margins: how many are not 0, and their quantiles."""
    values = sorted(row["toploc_errors"]["max_sampling_margin"] for row in rows if row.get("toploc_errors"))
    if not values:
        return
    quantile = {q: values[min(len(values) - 1, int(q * len(values)))] for q in (0.5, 0.9, 0.99)}
    print(
        f"honest rows' largest sampling margin: {sum(v > 0 for v in values)} of {len(values)} above 0; "
        f"median {quantile[0.5]:.3g}, p90 {quantile[0.9]:.3g}, p99 {quantile[0.99]:.3g}, max {values[-1]:.3g}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument(
        "--model-vocab",
        type=int,
        default=None,
        help="pad the embeddings to this vocabulary (e.g. 151936, as Qwen's)",
    )
    parser.add_argument("--tasks", type=int, default=24)
    parser.add_argument("-n", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per generation batch")
    parser.add_argument("--validate-batch-size", type=int, default=8, help="sequences per validation prefill")
    parser.add_argument("--topk", type=int, default=16)
    parser.add_argument("--chunk", type=int, default=8)
    parser.add_argument(
        "--backend", choices=("transformers", "vllm"), default="transformers", help="what generates the rows"
    )
    parser.add_argument(
        "--validate-backend",
        choices=("transformers", "vllm"),
        default="transformers",
        help="what validates them",
    )
    parser.add_argument("--device", default=None)
    parser.add_argument(
        "--gen-dtype",
        default=None,
        help="dtype of generation (default float32 on CPU); validation runs in float32",
    )
    parser.add_argument("--repeats", type=int, default=2, help="timed generation rounds per side (best kept)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (1: CPU seconds count work, not threads spinning on a shared machine)",
    )
    # Defaults: the calibration for the default tiny model (genesys/testing/tampering.py).
    parser.add_argument("--max-exp", type=int, default=TINY_THRESHOLDS.max_exp_mismatches)
    parser.add_argument("--max-mean", type=float, default=TINY_THRESHOLDS.max_mant_err_mean)
    parser.add_argument("--max-median", type=float, default=TINY_THRESHOLDS.max_mant_err_median)
    parser.add_argument("--logprob-tolerance", type=float, default=TINY_THRESHOLDS.logprob_tolerance)
    parser.add_argument("--sampling-margin", type=float, default=TINY_THRESHOLDS.sampling_margin)
    args = parser.parse_args()

    import torch
    from transformers import AutoTokenizer

    torch.set_num_threads(args.threads)

    from genesys.config import ProofConfig
    from genesys.generate.tiny_model import build_tiny_model
    from genesys.testing.tampering import (
        claiming,
        copy_proofs,
        edit_logprobs,
        generate,
        perturbed_model,
        swap_token,
        teacher_forced,
        write_tasks,
    )

    work = Path(tempfile.mkdtemp(prefix="validate-cost-"))
    shape = dict(
        hidden_size=args.hidden, layers=args.layers, heads=args.heads, model_vocab_size=args.model_vocab
    )
    model = str(build_tiny_model(work / "model", **shape))
    other = str(build_tiny_model(work / "other", seed=1, **shape))
    perturbed = perturbed_model(model, work / "perturbed")
    if args.gen_dtype == "bfloat16":  # a bf16 checkpoint: the same weights whether run in bf16 or in float32
        for path in (model, other, perturbed):
            as_bf16_checkpoint(path)
    tasks = write_tasks(work / "tasks.jsonl", args.tasks)
    proofs = ProofConfig(args.topk, args.chunk)
    toploc_only = ProofConfig(args.topk, args.chunk, sampling=False)
    kwargs = dict(n=args.n, max_tokens=args.max_tokens, dtype=args.gen_dtype)

    # The three sides: without proofs, TOPLOC proofs only, TOPLOC and sampling proofs.
    sides = {"plain": None, "toploc": toploc_only, "sampling": proofs}
    engines: dict[str, Any] = dict.fromkeys(sides)  # None: a transformers backend per run
    if "vllm" in (args.backend, args.validate_backend):
        global CLOCK
        CLOCK = time.perf_counter
    if args.backend == "vllm":
        engines = {side: vllm_engine(model, args, side_proofs) for side, side_proofs in sides.items()}
    for engine, engine_proofs in zip(engines.values(), sides.values()):
        generate(
            model,
            tasks,
            work / "warmup.jsonl",
            engine_proofs,
            n=1,
            max_tokens=4,
            dtype=args.gen_dtype,
            backend=engine,
        )
        (work / "warmup.jsonl").unlink()
    seconds = dict.fromkeys(sides, float("inf"))
    made: dict[str, list[dict[str, Any]]] = {}
    for round in range(
        args.repeats
    ):  # alternating rounds, the best of each kept: a loaded machine slows some
        this_round = {}
        for side, side_proofs in sides.items():
            output = work / f"{side}-{round}.jsonl"
            made[side], this_round[side] = timed(
                generate, model, tasks, output, side_proofs, backend=engines[side], **kwargs
            )
            seconds[side] = min(seconds[side], this_round[side])
        print(
            f"round {round}: generate {this_round['plain']:.2f}s without proofs, {this_round['toploc']:.2f}s with "
            f"TOPLOC proofs, {this_round['sampling']:.2f}s with TOPLOC and sampling proofs"
        )
    plain, honest = made["plain"], made["sampling"]
    plain_seconds, proof_seconds = seconds["plain"], seconds["sampling"]
    validated, validate_seconds = validate(honest, work, "honest", args, model)
    load_seconds = min(timed(load_validator, args, model)[1] for _ in range(args.repeats))
    tokens = sum(len(row["completion_ids"]) for row in honest)
    print(
        f"{len(honest)} rows, {tokens} completion tokens; hidden {args.hidden}, layers {args.layers}, topk {args.topk}, chunks of {args.chunk}"
    )
    print(
        f"generate without proofs: {plain_seconds:7.2f}s ({sum(len(r['completion_ids']) for r in plain) / plain_seconds:,.0f} tokens/s)"
    )
    print(
        f"generate, TOPLOC only:   {seconds['toploc']:7.2f}s ({seconds['toploc'] / plain_seconds - 1:+.1%} time)"
    )
    print(
        f"generate with proofs:    {proof_seconds:7.2f}s ({tokens / proof_seconds:,.0f} tokens/s, {proof_seconds / plain_seconds - 1:+.1%} time;"
        f" the seeded sampler {proof_seconds / seconds['toploc'] - 1:+.1%} over TOPLOC only)"
    )
    print(
        f"validate:                {validate_seconds:7.2f}s ({validate_seconds / proof_seconds:.1%} of generation with proofs), of which "
        f"{load_seconds:.2f}s loading and hashing the model: {(validate_seconds - load_seconds) / proof_seconds:.1%} without"
    )

    tokenizer = AutoTokenizer.from_pretrained(model)
    cases = {
        "another model": validate(
            claiming(generate(other, tasks, work / "other.jsonl", proofs, **kwargs), honest[0]),
            work,
            "other",
            args,
            model,
        )[0],
        "perturbed weights": validate(
            claiming(generate(perturbed, tasks, work / "perturbed.jsonl", proofs, **kwargs), honest[0]),
            work,
            "perturbed",
            args,
            model,
        )[0],
        "one token swapped": validate(
            [
                swap_token(row, tokenizer, position=len(row["completion_ids"]) // 2)
                for row in honest
                if len(row["completion_ids"]) > 2
            ],
            work,
            "swapped",
            args,
            model,
        )[0],
        "another row's proofs": validate(copy_proofs(honest), work, "copied", args, model)[0],
        "edited logprobs": validate(
            [edit_logprobs(row, -0.5, position=0) for row in honest], work, "logprobs", args, model
        )[0],
        "teacher-forced": validate(
            [teacher_forced(row, FORCED, model) for row in honest], work, "forced", args, model
        )[0],
    }
    print(
        f"\nthresholds: exp mismatches <= {args.max_exp}, mantissa mean <= {args.max_mean}, median <= {args.max_median};"
        f" |logprob diff| <= {args.logprob_tolerance}; sampling margin <= {args.sampling_margin}"
    )
    print(
        f"{'case':<26} {'rows':>4} {'rejected':>8} {'proof':>8} {'logprob':>8} {'sampling':>8} {'exp':>6} {'mean':>6}"
        f" {'median':>6} {'logprob':>9} {'margin':>9}"
    )
    report_case("honest (worst)", validated, honest=True)
    for name, rows in cases.items():
        report_case(name + " (least)", rows, honest=False)
    report_margins(validated)


if __name__ == "__main__":
    main()
