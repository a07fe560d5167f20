#!/bin/bash
# The thread-scaling table on a lent many-core machine (issue 25: 1, 2, 4, 8, 16 threads), as one
# command for the `device` tool, which runs it from a copy of this repo over the machine's own
# Python (3.12 there, with torch, numpy, onnx; no onnxruntime-training, no pydantic, no ortools).
#
# Here, first (the wheels the machine lacks, for its Python; .whl is ignored, then carried):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl \
#     onnxruntime-training-cpu==1.19.2 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 \
#     typing-inspection==0.4.5 typing_extensions==4.16.0 Cerberus==1.3.8 ortools==9.15.6755 immutabledict==4.3.1
# (ortools: the default plan of some corpus models runs the ILP; about 30 MB of the 64 MiB a call carries.)
# Then: device run, command `bash benchmarks/thread_scaling_device.sh`, carry [".whl"], timeout 590.
#
# Results land in $OUT as each model finishes (zoo16.md/.json, corpus16.md/.json, the logs); a
# fresh process there costs ~10 s (torch's CUDA libraries load), so 3 zoo models at 5 thread
# counts with both peers take ~300 s: order the models by what matters most. Session 23's partial
# table (reports/threads.md) came from an earlier form of this script.
T0=$(date +%s)
export PYTHONUNBUFFERED=1
left() { echo $(( $1 - ($(date +%s) - T0) )); }
{ nproc; lscpu | grep -E "Model name|Socket|Core|Thread|NUMA node\(s\)|MHz|L3"; free -g | head -2; uptime; python3 -V; } > "$OUT/env.txt" 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >> "$OUT/env.txt" 2>&1 || { echo "pip install of .whl failed"; cat "$OUT/env.txt"; exit 1; }
# The wheel puts cli/ and models/ under onnxplan/ (setup.py); a source tree on PYTHONPATH needs the same.
ln -sfn ../cli onnxplan/cli; ln -sfn ../models onnxplan/models
export PYTHONPATH=/tmp/site:$PWD ONNXPLAN_CACHE=/tmp/onnxplan-cache/artifacts
# What the benchmark needs, and nothing more (the CLI's reports need plotly, which is not there).
python3 - >> "$OUT/env.txt" 2>&1 <<'PY' || { cat "$OUT/env.txt"; exit 1; }
import numpy, onnx, onnxruntime, torch
from onnxruntime.training import api  # noqa: F401 - the ORT peer's training API
from onnxplan.kernels import native
from onnxplan.threads import available_cores
print("ort", onnxruntime.__version__, "torch", torch.__version__, "numpy", numpy.__version__, "onnx", onnx.__version__,
      "cores", available_cores(), "fused loops", native.adamw() is not None)
PY
cat "$OUT/env.txt"
timeout "$(left 420)" python3 benchmarks/thread_scaling.py ${ZOO:-transformer:16 gpt:16 mlp:64 resnet18:16 vgg16:16} \
  --threads 1,2,4,8,16 --rounds 1 --steps 5 --warmup 2 --out "$OUT/zoo16.md" > "$OUT/zoo.log" 2>&1
grep -E "^[a-z0-9:@-]+: " "$OUT/zoo.log"
echo "zoo done at $(( $(date +%s) - T0 )) s"
timeout "$(left 565)" python3 benchmarks/thread_scaling.py ${CORPUS:-hf-bert@bench hf-gpt2@bench hf-resnet@bench hf-llama@bench} \
  --threads 1,16 --rounds 1 --steps 5 --warmup 2 --out "$OUT/corpus16.md" > "$OUT/corpus.log" 2>&1
grep -E "^[a-z0-9:@-]+: " "$OUT/corpus.log"
echo "all done at $(( $(date +%s) - T0 )) s"
