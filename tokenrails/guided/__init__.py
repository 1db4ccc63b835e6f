"""Engine-agnostic core: spec, vocabulary, backend contract, backends, manager, batched step."""
