"""A user's script as the multiprocessing docs teach it: ``activate()`` at module level, the
engine built under ``if __name__ == "__main__":``. Every spawned process (TP ranks, the
api_server's engine process) re-imports this file, so the module level runs there too.

    python tests/engine_patch/lmdeploy/user_script.py pipeline TP REGEX
    python tests/engine_patch/lmdeploy/user_script.py serve PORT

(Never imported by the tests: importing it activates the upgrade.)

With ``$PATCH_REPORT`` set, every process that runs the module level appends its patch layers
(patch_layers.py) to that file.
"""
import os
import sys

from tokenrails.engine_patch.lmdeploy import activate

activate()

if os.environ.get("PATCH_REPORT"):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
    from tests.engine_patch.lmdeploy import patch_layers

    patch_layers.report(os.environ["PATCH_REPORT"])

if __name__ == "__main__":
    import torch

    torch.set_num_threads(1)
    from tokenrails.demo_model import resolve_model_dir
    from tokenrails.engine_patch.lmdeploy.cpu import cpu_engine_config

    model_dir, _, _ = resolve_model_dir(quiet=True)
    if sys.argv[1] == "pipeline":
        from lmdeploy import GenerationConfig, pipeline

        cfg = cpu_engine_config(tp=int(sys.argv[2]), max_batch_size=2, session_len=512)
        cfg.dtype = "float32"
        pipe = pipeline(str(model_dir), backend_config=cfg)
        try:
            out = pipe(["Write a code."], gen_config=[GenerationConfig(
                top_k=1, max_new_tokens=8, response_format={"type": "regex_schema", "regex_schema": sys.argv[3]})])
            print("RESULT " + out[0].text, flush=True)
        finally:
            pipe.close()
    else:
        from lmdeploy.serve.openai.api_server import serve

        serve(str(model_dir), backend="pytorch", backend_config=cpu_engine_config(max_batch_size=2, session_len=512),
              server_name="127.0.0.1", server_port=int(sys.argv[2]), log_level="WARNING")
