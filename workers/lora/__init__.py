"""orch's LoRA fine-tuning worker: `python -m workers.lora --config RUN_DIR/config.yaml --run-dir RUN_DIR`.

GLUE tasks as one-token language modelling on a local HF causal LM (or GLA through fla), with
heartbeats in progress.jsonl and the outcome in result.json (see workers/harness.py).
"""
