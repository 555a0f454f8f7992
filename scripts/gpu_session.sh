#!/usr/bin/env bash
# One prepared GPU session (issue 26): the CUDA tests with sync-debug mode, `polyfuse bench
# gpu`, `polyfuse bench peers --device cuda` and `polyfuse bench compile --device cuda`,
# everything written under one output folder. Sized to end within about 9 minutes (one
# device call of at most 10 minutes, out of a 15-minute device budget that also pays the
# machine's start): every step has a wall-clock limit and the benchmarks a time budget,
# the most wanted first.
#
#   scripts/gpu_session.sh OUT PEERS                 # on a machine with CUDA
#   scripts/gpu_session.sh OUT PEERS --cpu-dry-run   # the same steps on the CPU at tiny sizes
#   scripts/gpu_session.sh --stage-peers SRC DEST    # copy the peer files the bench imports
#
# PEERS holds checkouts of github.com/wangzih98/MAN, jnhwkim/ban-vqa and
# pliang279/MultiBench as MAN/, ban-vqa/ and MultiBench/ (the layout of /work/peers).
# The device machine receives only the repository: stage the few files the bench imports
# into a folder of the repository that git ignores (`echo /.peers/ >> .git/info/exclude;
# scripts/gpu_session.sh --stage-peers /work/peers .peers`, under 1 MB) and carry it: with
# the device tool, run(command="scripts/gpu_session.sh $OUT .peers", carry=[".peers"],
# timeout_s=600). Try `scripts/gpu_session.sh /tmp/dry .peers --cpu-dry-run` here first
# (about 2 minutes on 2 cores).
#
# OUT receives at most 7 files (the device tool returns 8): session.log (every step's
# output), peers_cuda.json/.md, gpu.json/.md, compile_cuda.json and
# compile_cuda_reduce_overhead.json (on the CPU: peers.*, gpu_cpu.*, compile*.json).
# The interpreter is $PYTHON (default python3); it needs torch and einops (the CLI's
# bench commands import neither pydantic nor geoopt).
set -u -o pipefail

here=$(cd "$(dirname "$0")/.." && pwd)

if [[ "${1:-}" == "--stage-peers" ]]; then
    source_dir=${2:?usage: $0 --stage-peers SRC DEST}
    dest=${3:?usage: $0 --stage-peers SRC DEST}
    mkdir -p "$dest/MAN" "$dest/ban-vqa" "$dest/MultiBench"
    cp "$source_dir"/MAN/*.py "$dest/MAN/"
    cp "$source_dir"/ban-vqa/*.py "$dest/ban-vqa/"
    cp "$source_dir"/MultiBench/__init__.py "$dest/MultiBench/" 2>/dev/null || true
    for package in fusions unimodals; do
        mkdir -p "$dest/MultiBench/$package"
        cp "$source_dir/MultiBench/$package"/*.py "$dest/MultiBench/$package/"
    done
    for peer in MAN ban-vqa MultiBench; do  # the commit, read by `polyfuse bench peers` from a copy
        git -C "$source_dir/$peer" rev-parse HEAD > "$dest/$peer/PEER_COMMIT" 2>/dev/null || rm -f "$dest/$peer/PEER_COMMIT"
    done
    du -sh "$dest"
    exit 0
fi

out=${1:?usage: $0 OUT PEERS [--cpu-dry-run]}
peers=${2:?usage: $0 OUT PEERS [--cpu-dry-run]}
dry_run=0
[[ "${3:-}" == "--cpu-dry-run" ]] && dry_run=1
python=${PYTHON:-python3}
mkdir -p "$out"
out=$(cd "$out" && pwd)
peers=$(cd "$peers" && pwd)
cd "$here"
export PYTHONPATH="$here/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
exec > >(tee -a "$out/session.log") 2>&1

failed=()
step() {  # step NAME SECONDS COMMAND...: run with a wall-clock limit, log its exit code
    local name=$1 limit=$2 start rc
    shift 2
    echo "=== $name (limit ${limit} s): $*"
    start=$(date +%s)
    timeout --signal=INT --kill-after=20 "$limit" "$@"
    rc=$?
    echo "=== $name: exit $rc after $(( $(date +%s) - start )) s"
    [[ $rc -eq 0 ]] || failed+=("$name ($rc)")
}
polyfuse=("$python" -m polyfuse.cli.main)  # an array: timeout runs programs, not shell functions

echo "=== gpu_session.sh $(git -C "$here" rev-parse --short HEAD 2>/dev/null) $(date -u +%FT%TZ) dry_run=$dry_run"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
"$python" - <<'EOF'
import importlib, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      torch.cuda.get_device_name() if torch.cuda.is_available() else "")
for name in ("einops", "pytest", "pydantic", "geoopt", "lightning"):
    try:
        importlib.import_module(name)
        print(name, "ok")
    except ImportError as error:
        print(name, "missing:", error)
EOF

if [[ $dry_run -eq 0 ]]; then
    device=cuda
    peer_sizes=(--batch-sizes "32 512" --repeats 15 --warmup 3)
    gpu_sizes=(--compiled-grid first --time-budget 140)
    compile_sizes=(--batch 256 --train --repeats 15 --warmup 3 --time-budget 90)
    overhead_sizes=(--modules "lmf tfn" --batch 32 --repeats 15 --warmup 3 --time-budget 20)
else
    device=cpu
    peer_sizes=(--rows "man ban_small tfn lmf" --batch-sizes 4 --thread-counts 1 --repeats 2 --warmup 0)
    gpu_sizes=(--quick --threads 1)
    compile_sizes=(--backend eager --modules "lmf tfn concat" --batch 4 --repeats 2 --warmup 0 --threads 1
                   --time-budget 60)
    overhead_sizes=(--backend eager --modules lmf --batch 4 --repeats 2 --warmup 0 --threads 1 --time-budget 20)
fi

# 1. What only a GPU checks: CUDA against the CPU, autocast, CUDA graphs around the
#    eager LSTM, and a default forward+backward under torch.cuda.set_sync_debug_mode("error").
step tests 90 "$python" -m pytest -q -p no:cacheprovider -rs tests/nn/test_cuda.py tests/nn/test_contract.py -k cuda
# 2. The peers on the GPU, batch 32 and 512 (the issue's sizes), with the run-time patches listed;
#    eval mode only (train mode doubles the step, which the session's 15 minutes do not hold).
step peers 80 "${polyfuse[@]}" bench peers --device "$device" --man "$peers/MAN" --ban-vqa "$peers/ban-vqa" \
    --multibench "$peers/MultiBench" "${peer_sizes[@]}" --modes eval --no-plots --output-dir "$out"
# 3. Every module by batch and length, eager and compiled, fp32 and bf16, memory; MAN's crossover.
step gpu 190 "${polyfuse[@]}" bench gpu --device "$device" "${gpu_sizes[@]}" --output-dir "$out"
# 4. Compiled against eager as the issue measured it (training mode, forward+backward, batch 256).
step compile 130 "${polyfuse[@]}" bench compile --device "$device" "${compile_sizes[@]}" --output-dir "$out"
# 5. CUDA graphs (reduce-overhead) for the two modules whose LSTM runs eagerly between graphs.
step compile_reduce_overhead 50 "${polyfuse[@]}" bench compile --device "$device" --mode reduce-overhead \
    "${overhead_sizes[@]}" --output-dir "$out"

echo "=== files in $out:"
ls -l "$out"
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "=== steps that failed or ran out of time: ${failed[*]}"
    exit 1
fi
echo "=== all steps passed"
