"""``SequenceGeneratorAdapter``: what every outlines 0.x ``generate.*`` function returns."""
from __future__ import annotations

import copy
import queue
import threading
from typing import Any, Callable, Iterator, List, Optional, Union

import torch

from ..samplers import multinomial


class SequenceGeneratorAdapter:
    """``generator(prompts, max_tokens=None, stop_at=None, seed=None, **model_specific_params)``."""

    def __init__(self, model: Any, logits_processor: Any, sampler: Any = None):
        self.model = model
        self.logits_processor = logits_processor
        self.sampler = sampler if sampler is not None else multinomial()
        self.format_sequence: Callable[[str], Any] = lambda text: text

    def _format(self, sequences: Any) -> Any:
        if isinstance(sequences, list):
            return [self._format(s) for s in sequences]
        return self.format_sequence(sequences)

    def __call__(
        self,
        prompts: Union[str, List[str]],
        max_tokens: Optional[int] = None,
        stop_at: Optional[Union[str, List[str]]] = None,
        seed: Optional[int] = None,
        **model_specific_params: Any,
    ) -> Any:
        processor, kwargs = self._prepare(max_tokens, stop_at, seed, model_specific_params)
        single = isinstance(prompts, str)
        texts = self.model.generate_ids_text([prompts] if single else list(prompts), processor, **kwargs)
        result = self._format(texts)
        return result[0] if single else result

    def _prepare(self, max_tokens: Optional[int], stop_at: Any, seed: Optional[int],
                 model_specific_params: dict) -> tuple[Any, dict]:
        """The step's processor (a copy: one matcher state per call) and transformers' kwargs."""
        rng = model_specific_params.pop("rng", None)  # outlines 0.0.x seeding; not a transformers kwarg
        if seed is None and isinstance(rng, torch.Generator):
            seed = rng.initial_seed()
        kwargs = dict(self.sampler.generate_kwargs())
        kwargs.update(model_specific_params)
        if max_tokens is not None:
            kwargs["max_new_tokens"] = int(max_tokens)
        else:  # outlines: no limit but the grammar's own end (or the model's context)
            kwargs.setdefault("max_new_tokens", int(getattr(self.model.model.config, "max_position_embeddings", 2048)))
        if stop_at is not None:
            kwargs["stop_strings"] = [stop_at] if isinstance(stop_at, str) else list(stop_at)
        if seed is not None:
            torch.manual_seed(seed)
        processor = copy.copy(self.logits_processor) if self.logits_processor is not None else None
        return processor, kwargs

    def stream(
        self,
        prompts: Union[str, List[str]],
        max_tokens: Optional[int] = None,
        stop_at: Optional[Union[str, List[str]]] = None,
        seed: Optional[int] = None,
        **model_specific_params: Any,
    ) -> Iterator[Any]:
        """outlines' ``generator.stream``: the new text of each step, a ``str`` for one prompt and a
        list (one piece per sequence) for several. Generation runs in a thread feeding a streamer;
        pieces are differences of each sequence's decoded text, so multi-token characters arrive whole."""
        processor, kwargs = self._prepare(max_tokens, stop_at, seed, model_specific_params)
        single = isinstance(prompts, str)
        steps: queue.Queue = queue.Queue()
        kwargs["streamer"] = _StepStreamer(steps)
        failure: list[BaseException] = []

        def run() -> None:
            try:
                self.model.generate_ids_text([prompts] if single else list(prompts), processor, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the consumer
                failure.append(exc)
            finally:
                steps.put(None)

        worker = threading.Thread(target=run, name="tokenrails-outlines-stream", daemon=True)
        worker.start()
        tokenizer = self.model.hf_tokenizer
        ids: list[list[int]] | None = None
        texts: list[str] = []
        while (step := steps.get()) is not None:
            if ids is None:
                ids, texts = [[] for _ in step], ["" for _ in step]
            pieces = []
            for k, token in enumerate(step):
                ids[k].append(token)
                text = tokenizer.decode(ids[k], skip_special_tokens=True)
                if text.startswith(texts[k]):  # else: an incomplete character, held until it completes
                    pieces.append(text[len(texts[k]):])
                    texts[k] = text
                else:
                    pieces.append("")
            yield pieces[0] if single and len(pieces) == 1 else pieces
        worker.join()
        if failure:
            raise failure[0]


class _StepStreamer:
    """transformers' streamer protocol: ``put`` gets the prompt ids once, then each step's new ids."""

    def __init__(self, steps: "queue.Queue[list[int] | None]"):
        self.steps = steps
        self.prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.steps.put(value.reshape(-1).tolist())

    def end(self) -> None:
        pass
