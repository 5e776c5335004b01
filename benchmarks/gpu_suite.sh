#!/usr/bin/env bash
# The GPU figures of genesys in one command (one H100/H200, about 12 minutes, no downloads: every model
# is a random-weight model of a real shape written from its config):
#   1. genesys generate with vLLM against a plain vLLM script (goal >= 0.97x); without vLLM, sections 2
#      and 3 run with transformers generation instead and the summary names vLLM as missing
#   2. genesys train against TRL 1.16, both with a colocated vLLM engine, same model and batch (goal >= 1.5x)
#   3. genesys train per model shape: bf16 with colocated vLLM, fsdp2 in one process, steps/s, tokens/s,
#      the sampler/trainer logprob mismatch, peak memory against the --dry-run estimate (goal within 15%)
#   4. peak memory against the token budget and against the estimate (benchmarks/train_memory.py)
#
#   benchmarks/gpu_suite.sh            # on a GPU machine, from the repository root
#   benchmarks/gpu_suite.sh --smoke    # CPU, tiny shapes: the plumbing of section 3 only
# PYTHON names the interpreter (default: python). Each section has a time limit and the suite goes on
# when one fails; the summary names the failed ones.
set -uo pipefail

PYTHON=${PYTHON:-python}
SMOKE=0
for argument in "$@"; do
    case "$argument" in
        --smoke) SMOKE=1 ;;
        -h | --help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu_suite.sh: unknown argument $argument (try --help)" >&2; exit 2 ;;
    esac
done
HERE=$(cd "$(dirname "$0")" && pwd)
FAILED=()

section() {  # section TITLE SECONDS COMMAND...
    local title=$1 limit=$2
    shift 2
    echo
    echo "== $title"
    if ! timeout "$limit" "$@"; then
        FAILED+=("$title")
        echo "-- $title: failed or ran past ${limit}s"
    fi
}

if [ "$SMOKE" = 1 ]; then
    section "train: shapes, mismatch, memory (smoke)" 600 "$PYTHON" "$HERE/gpu_suite.py" --smoke
else
    if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
        echo "gpu_suite.sh: no CUDA device; run with --smoke on CPU" >&2
        exit 2
    fi
    echo "machine: $("$PYTHON" -c 'import torch; print(torch.cuda.get_device_name(0))'), $(date -u +%Y-%m-%d)"
    if "$PYTHON" -c "import vllm" 2>/dev/null; then
        section "generate: genesys vs plain vLLM" 150 "$PYTHON" "$HERE/generate_throughput.py" --backend vllm \
            --shape qwen2.5-1.5b --dtype bfloat16 --prompts 256 --samples 8 --max-tokens 256 --repeats 2 \
            --engine-arg gpu_memory_utilization=0.35
        section "train: genesys vs TRL, colocated vLLM" 200 "$PYTHON" "$HERE/train_vs_trl.py" --device cuda \
            --model-size qwen2.5-0.5b --trainers genesys-vllm,trl-vllm --steps 12 --warmup 2 --rounds 1 --vllm-memory 0.3
        section "train: shapes, fsdp2, mismatch, memory" 200 "$PYTHON" "$HERE/gpu_suite.py" --shapes qwen2.5-0.5b qwen2.5-1.5b
    else
        echo "no vLLM here: the generate section is left out, and the trainers sample with their own models"
        FAILED+=("vLLM not installed")
        section "train: genesys vs TRL, transformers generation" 200 "$PYTHON" "$HERE/train_vs_trl.py" \
            --device cuda --precision bf16 --model-size qwen2.5-0.5b --trainers genesys,trl --steps 10 --warmup 2 --rounds 2
        section "train: shapes, fsdp2, mismatch, memory" 420 "$PYTHON" "$HERE/gpu_suite.py" --backend transformers \
            --shapes qwen2.5-0.5b qwen2.5-1.5b --steps 4 --max-tokens 256
    fi
    section "train memory: token budget and estimate" 120 "$PYTHON" "$HERE/train_memory.py" --device cuda --table estimate
fi

echo
if [ ${#FAILED[@]} -eq 0 ]; then
    echo "gpu_suite: every section ran"
else
    echo "gpu_suite: failed: ${FAILED[*]}"
    exit 1
fi
