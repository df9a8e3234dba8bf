#!/usr/bin/env bash
# Reproduces the table in docs/results/parm.md: every model trained and evaluated
# here, figures read back from the manifests by `evaluate --table`.
# One thread, niced: the machine is shared. About 10 minutes on 2 busy cores.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 PYTHONPATH=.
S=runs/accuracy/store R=runs/accuracy
py() { nice -n 10 .venv/bin/python -m keel.training.cli "$@"; }

py train deployed --dataset digits  --arch mlp    --epochs 60 --seed 0 --store $S
py train deployed --dataset mnist5k --arch mlp    --epochs 30 --seed 0 --store $S
py train deployed --dataset mnist5k --arch mlp    --epochs 30 --seed 0 --store $S --init torch --name mnist5k-mlp-torchinit
py train deployed --dataset mnist5k --arch lenet5 --epochs 30 --seed 0 --store $S

py train parity --model digits-mlp --k 2 --encoder add --epochs 200 --seed 0 --store $S
for k in 2 3 4; do
  py train parity --model mnist5k-mlp --k $k --encoder add --epochs 200 --seed 0 --store $S
done
py train parity --model mnist5k-mlp-torchinit --k 2 --encoder add --epochs 200 --seed 0 --store $S
py train parity --model mnist5k-lenet5 --k 2 --encoder add    --epochs 100 --seed 0 --store $S
py train parity --model mnist5k-lenet5 --k 2 --encoder concat --epochs 100 --seed 0 --store $S
py train parity --model mnist5k-lenet5 --k 4 --encoder concat --epochs 100 --seed 0 --store $S

for p in digits-mlp-parity-k2-add mnist5k-mlp-parity-k{2,3,4}-add mnist5k-mlp-torchinit-parity-k2-add \
         mnist5k-lenet5-parity-k2-add mnist5k-lenet5-parity-k{2,4}-concat; do
  py evaluate --parity $p --seed 0 --store $S --runs $R
done
py evaluate --table --store $S
