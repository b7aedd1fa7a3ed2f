#!/usr/bin/env bash
# GPU check of the trainer (issue 7): `retool train recipe=dapo_smoke` on CUDA for a few steps with bf16
# (fp32 master weights, bf16 autocast in the update, bf16 sampling copy), then the same recipe on a
# Qwen2.5-0.5B-shaped model built from random weights (no download), padded and packed (trainer.pack_sequences,
# issue 41: its log-probs against the padded pass's on the GPU first), and the smoke recipe overlapped (issue 40:
# k = 1 with partial rollouts, twice, the same or not). Prints step time, tokens/s and peak GPU
# memory per step from each run's metrics.jsonl; copies the metrics to $OUT when that is set.
#
#     bash benchmarks/gpu_check.sh [steps] [steps_0.5b]
#
# Needs the package importable (pip install -e . or PYTHONPATH=.) and a CUDA GPU.
set -euo pipefail
STEPS=${1:-6}
STEPS_BIG=${2:-4}
WORK=${WORK:-/tmp/retool-gpu-check}
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu LAYERS=2 checks the script itself on a CPU
LAYERS=${LAYERS:-24}
export RETOOL_CACHE="$WORK/cache" PYTHONUNBUFFERED=1
RETOOL="python3 -m retool_cli"
rm -rf "$WORK" && mkdir -p "$WORK"
if [ "$DEVICE" = cuda ]; then nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; fi
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"

$RETOOL prepare recipe=dapo_smoke hydra.run.dir="$WORK/prepare"
CUDA_BF16=(model.device="$DEVICE" model.dtype=float32 trainer.bf16_autocast=true rollout.dtype=bfloat16
  trainer.train_file="$WORK/prepare/train.jsonl" trainer.resume=false trainer.save_every=1000)

# 1. The smoke recipe's tiny model on the GPU.
$RETOOL train recipe=dapo_smoke "${CUDA_BF16[@]}" trainer.total_steps="$STEPS" hydra.run.dir="$WORK/smoke"

# 2. A Qwen2.5-0.5B-shaped decoder (24 layers, hidden 896, 14 query / 2 key-value heads, MLP 4864) with random
# weights and the tiny tokenizer (so its vocabulary, and embedding, are the tiny model's).
python3 - "$WORK/q05b" "$LAYERS" <<'EOF'
import sys
import torch
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
from retool_cli.model.tiny import tiny_model_path

tokenizer = AutoTokenizer.from_pretrained(tiny_model_path())
torch.manual_seed(0)
config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=896, intermediate_size=4864, num_hidden_layers=int(sys.argv[2]),
                     num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
                     rope_theta=1e6, tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                     eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
model = Qwen2ForCausalLM(config)
model.save_pretrained(sys.argv[1])
tokenizer.save_pretrained(sys.argv[1])
print(f"0.5B-shaped model: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters -> {sys.argv[1]}")
EOF
$RETOOL train recipe=dapo_smoke "${CUDA_BF16[@]}" model.name_or_path="$WORK/q05b" model.max_context_tokens=1024 \
  trainer.total_steps="$STEPS_BIG" hydra.run.dir="$WORK/q05b_train"

# 3. The same with packed rows: first the packed pass against the padded one on this GPU (fp32 and bf16 autocast),
# then the run.
python3 - "$WORK/q05b" "$DEVICE" <<'EOF'
import sys
import torch
from transformers import AutoModelForCausalLM
from retool_cli.rl.logprobs import sequence_logprobs

device = torch.device(sys.argv[2])
model = AutoModelForCausalLM.from_pretrained(sys.argv[1]).to(device).train()
generator = torch.Generator().manual_seed(0)
prompt = torch.randint(10, 300, (40,), generator=generator).tolist()
sequences = [prompt + torch.randint(10, 300, (n,), generator=generator).tolist() for n in (300, 30, 120, 7)]
prompt_lens = [len(prompt)] * len(sequences)
# shared prompts: SDPA per segment; whole sequences in bf16: flash-attention's varlen kernel (rl/packing.py)
for shared, bf16 in ((True, False), (True, True), (False, False), (False, True)):
    padded, packed = (
        sequence_logprobs(model, sequences, 0, device, bf16_autocast=bf16, prompt_lens=prompt_lens,
                          shared_prefix=shared, pack=pack)[0]
        for pack in (False, True)
    )
    response = packed != 0
    print(f"packed vs padded, shared prompts={shared}, bf16_autocast={bf16}: max |log-prob difference| "
          f"{(padded[response] - packed[response]).abs().max().item():.2e} over {int(response.sum())} tokens")
EOF
$RETOOL train recipe=dapo_smoke "${CUDA_BF16[@]}" model.name_or_path="$WORK/q05b" model.max_context_tokens=1024 \
  trainer.pack_sequences=true trainer.total_steps="$STEPS_BIG" hydra.run.dir="$WORK/q05b_packed"

# 4. Overlapped training (issue 40) on the GPU: the smoke recipe at k = 1 with partial rollouts, colocated, twice,
# the second with random delays in the tools, the engine and the update. The same metrics and final weights from
# both is the determinism claim on this device (CUDA kernels may not be bit-reproducible run to run: what this
# prints is what to learn); run 1 is k = 0's time per step beside them.
OVERLAP=(trainer.max_staleness=1 rollout.partial=true trainer.total_steps="$STEPS")
$RETOOL train recipe=dapo_smoke "${CUDA_BF16[@]}" "${OVERLAP[@]}" hydra.run.dir="$WORK/overlap"
RETOOL_JITTER=tools:0.05,engine:0.05,update:0.4 \
  $RETOOL train recipe=dapo_smoke "${CUDA_BF16[@]}" "${OVERLAP[@]}" hydra.run.dir="$WORK/overlap_jittered"
python3 - "$WORK" "$STEPS" <<'EOF'
import json, sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from tests.helpers import TIMING

work, steps = Path(sys.argv[1]), sys.argv[2]
noisy = (*TIMING, "memory/", "rollout/code_cache_hit_rate", "rollout/prefix_cache_hit_rate")
runs = [[{k: v for k, v in json.loads(line).items() if not k.startswith(noisy)}
         for line in (work / name / "metrics.jsonl").read_text().splitlines()] for name in ("overlap", "overlap_jittered")]
for a, b in zip(*runs, strict=True):
    differing = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    print(f"overlap step {a['step']}: " + (f"differs in {differing[:6]}" if differing else "the same metrics"))
weights = [load_file(work / name / "checkpoints" / f"step_{steps}" / "model.safetensors")
           for name in ("overlap", "overlap_jittered")]
same = weights[0].keys() == weights[1].keys() and all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
print(f"overlap final weights: {'the same bit for bit' if same else 'differ'}")
EOF

python3 - "$WORK" <<'EOF'
import json, statistics, sys
from pathlib import Path

for name in ("smoke", "q05b_train", "q05b_packed", "overlap", "overlap_jittered"):
    rows = [json.loads(line) for line in (Path(sys.argv[1]) / name / "metrics.jsonl").read_text().splitlines()]
    later = rows[1:] or rows  # the first step includes start-up (CUDA context, first kernels)
    step_s = [r.get("time/step_wall_s", r["time/rollout_s"] + r["time/update_s"]) for r in later]
    print(f"{name}: {len(rows)} steps; median step {statistics.median(step_s):.2f} s "
          f"(rollout {statistics.median(r['time/rollout_s'] for r in later):.2f}, "
          f"update {statistics.median(r['time/update_s'] for r in later):.2f}); generation "
          f"{statistics.median(r['rollout/gen_tokens_per_s'] for r in later):.0f} tokens/s; peak GPU memory "
          f"{max(r.get('memory/gpu_peak_gib', 0.0) for r in rows):.2f} GiB; mean response "
          f"{statistics.mean(r.get('rollout/response_tokens', 0.0) for r in rows):.0f} tokens; padding share "
          f"{statistics.mean(r['train/padding_share'] for r in rows):.2f}, "
          f"{statistics.median(r['time/train_tokens_per_s'] for r in later):.0f} trained tokens/s")
EOF
if [ -n "${OUT:-}" ]; then
  cp "$WORK/smoke/metrics.jsonl" "$OUT/smoke_metrics.jsonl"
  cp "$WORK/q05b_train/metrics.jsonl" "$OUT/q05b_metrics.jsonl"
  cp "$WORK/q05b_packed/metrics.jsonl" "$OUT/q05b_packed_metrics.jsonl"
  cp "$WORK/overlap/metrics.jsonl" "$OUT/overlap_metrics.jsonl"
fi
