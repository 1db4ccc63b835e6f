"""Engine integrations. ``transformers`` (any machine, CPU included) and ``lmdeploy`` (GPU).

Submodules are imported on use so that importing one integration never pulls in the other.
"""
