"""transformers integration internals; the public surface is ``tokenrails.engine_patch.transformers``."""
