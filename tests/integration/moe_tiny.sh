# moe_tiny.sh - sourced by moe_test.sh and moe_ep_test.sh (after $work and fail() exist): the
# tiny MoE model both train (4 layers, every second one MoE with 4 experts of hidden 48, top-2,
# aux and z losses) as $tiny, and compare_runs.sh's helpers.
tiny=(--mock-data --tokenizer-type NullTokenizer --vocab-size 500 --num-layers 4 --hidden-size 32
      --num-attention-heads 4 --seq-length 32 --micro-batch-size 2 --global-batch-size 8 --lr 1e-3
      --attention-dropout 0 --data-cache-path "$work/cache" --log-interval 1 --eval-interval 1000 --eval-iters 2
      --threads 1 --disable-bias-linear
      --num-experts 4 --moe-router-topk 2 --moe-layer-freq 2 --moe-ffn-hidden-size 48
      --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3)
. "${COHORT_SOURCE_ROOT:?}/tests/integration/compare_runs.sh"
