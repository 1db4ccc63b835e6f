"""Run LMDeploy 0.18's PyTorch engine on CPU: ``enable()`` then ``PytorchEngineConfig(device_type='cpu')``.

Imported only on request (nothing in tokenrails imports it implicitly). See docs/lmdeploy.md,
"Running the real engine on CPU", for what is patched and why.
"""
from .enable import cpu_engine_config, enable

__all__ = ["enable", "cpu_engine_config"]
