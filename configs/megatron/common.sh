# Shared settings of the example launches (sourced by the pretrain_gpt_*.sh scripts).
# Override any of these in the environment.
ZEPHON_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
NPROC="${NPROC:-8}"            # processes on this node
TP="${TP:-1}"                  # --tensor-model-parallel-size
PP="${PP:-1}"                  # --pipeline-model-parallel-size
CP="${CP:-1}"                  # --context-parallel-size (--seq-length must be a multiple of 2 x CP)
MBS="${MBS:-4}"                # --micro-batch-size
GBS="${GBS:-64}"               # --global-batch-size: GBS / MBS must be a multiple of the recipe's canonical_replicas (8)
SEQ="${SEQ:-1024}"
ITERS="${ITERS:-2000}"
LAYERS="${LAYERS:-12}" HIDDEN="${HIDDEN:-768}" HEADS="${HEADS:-12}"   # the GPT's size
PRECISION="${PRECISION---bf16}"   # --bf16, --fp16, or empty for fp32
RECIPE="${RECIPE:-$ZEPHON_ROOT/configs/data/mg_train.toml}"
VALID_RECIPE="${VALID_RECIPE:-$ZEPHON_ROOT/configs/data/mg_heldout.toml}"
RUN_DIR="${RUN_DIR:-/tmp/zephon-megatron-gpt}"   # checkpoints, loader states, aggregation (shared by all nodes)
RUN_ID="${RUN_ID:-gpt-demo}"                     # unique per training run; keep it when resuming

export PYTHONPATH="$ZEPHON_ROOT:$ZEPHON_ROOT/integrations/megatron${PYTHONPATH:+:$PYTHONPATH}"
export CUDA_DEVICE_MAX_CONNECTIONS=1

# A small GPT over the bundled BPE tokenizer (HuggingFaceTokenizer needs `transformers`:
# pip install ".[megatron]"; it reads configs/corpus offline).
MODEL_FLAGS=(
  --tensor-model-parallel-size "$TP" --pipeline-model-parallel-size "$PP" --context-parallel-size "$CP"
  --num-layers "$LAYERS" --hidden-size "$HIDDEN" --num-attention-heads "$HEADS"
  --seq-length "$SEQ" --max-position-embeddings "$SEQ"
  --micro-batch-size "$MBS" --global-batch-size "$GBS" --train-iters "$ITERS"
  --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 100 --weight-decay 0.1 --clip-grad 1.0
  $PRECISION
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$ZEPHON_ROOT/configs/corpus"
  --eod-mask-loss
  --log-interval 10
)

# Zephon: the loader, its state next to the checkpoints, evaluation on held-out data.
ZEPHON_FLAGS=(
  --zephon-recipe "$RECIPE"
  --zephon-valid-recipe "$VALID_RECIPE" --eval-iters 10 --eval-interval 200
  --zephon-aggregate-dir "$RUN_DIR/zephon-aggregate" --zephon-run-id "$RUN_ID"
  --save "$RUN_DIR/checkpoints" --load "$RUN_DIR/checkpoints" --save-interval 200
  --dataloader-save "$RUN_DIR/loader-state"
  --no-create-attention-mask-in-dataloader
)

TORCHRUN=(torchrun --nproc-per-node "$NPROC" --rdzv-backend c10d --rdzv-endpoint localhost:0)
