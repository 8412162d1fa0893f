"""The formats and tools of the wider ecosystem: safetensors weights, ONNX graphs, Hugging Face GPT-2
checkpoints, TensorBoard and MLflow logs.

Hand-written, not generated: students do not write these in a lesson. Each file needs its own
optional package (``pip install 'tinytrain[safetensors]'``, ``[onnx]``, ``[tensorboard]``,
``[mlflow]``, ``[huggingface]``), imported only when a function asks for it, with an error saying
what to install when it is absent.
"""
