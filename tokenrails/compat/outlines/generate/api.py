"""``SequenceGeneratorAdapter``: what every outlines 0.x ``generate.*`` function returns."""
from __future__ import annotations

import copy
import queue
import threading
from typing import Any, Callable, Iterator, List, Optional, Union

import torch

from .... import start_native_thread
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
        if not callable(getattr(self.sampler, "generate_kwargs", None)) or _first_accepting_state_ends():
            generator, rng = self._outlines_loop(model_specific_params.pop("rng", None), seed)
            _no_more_arguments(model_specific_params)
            return generator(prompts, max_tokens=max_tokens, stop_at=stop_at, rng=rng)
        processor, kwargs = self._prepare(max_tokens, stop_at, seed, model_specific_params)
        single = isinstance(prompts, str)
        texts = self.model.generate_ids_text([prompts] if single else list(prompts), processor, **kwargs)
        result = self._format(texts)
        return result[0] if single else result

    def _outlines_loop(self, rng: Optional[torch.Generator],
                       seed: Optional[int]) -> tuple["SequenceGenerator", Optional[torch.Generator]]:
        """A sampler of outlines' own protocol (``sampler(logits, weights, rng)``, no transformers
        equivalent): outlines' token loop with this generator's guide, formatting included."""
        from ..fsm.guide import StopAtEOSGuide

        guide = (self.logits_processor.guide.copy() if self.logits_processor is not None
                 else StopAtEOSGuide(self.model.tokenizer))
        generator = SequenceGenerator(guide, self.model, self.sampler, self.model.model.device)
        generator.format_sequence = self.format_sequence
        if rng is None and seed is not None:
            rng = torch.Generator(device=generator.device)
            rng.manual_seed(seed)
        return generator, rng

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
        pieces are differences of each sequence's decoded text, so multi-token characters arrive whole.
        Several samples per prompt (multinomial ``samples=``, beam search) stream through outlines'
        own loop, which keeps outlines' ``[prompt][sample]`` grouping (transformers' streamers
        refuse beams)."""
        if (getattr(self.sampler, "samples", 1) > 1 or not callable(getattr(self.sampler, "generate_kwargs", None))
                or _first_accepting_state_ends()):
            generator, rng = self._outlines_loop(model_specific_params.pop("rng", None), seed)
            _no_more_arguments(model_specific_params)
            yield from generator.stream(prompts, max_tokens=max_tokens, stop_at=stop_at, rng=rng)
            return
        processor, kwargs = self._prepare(max_tokens, stop_at, seed, model_specific_params)
        single = isinstance(prompts, str)
        steps: queue.Queue = queue.Queue()
        streamer = kwargs["streamer"] = _StepStreamer(steps)
        failure: list[BaseException] = []

        def run() -> None:
            try:
                self.model.generate_ids_text([prompts] if single else list(prompts), processor, **kwargs)
            except _StreamClosed:
                pass
            except BaseException as exc:  # noqa: BLE001 - re-raised in the consumer
                failure.append(exc)
            finally:
                steps.put(None)

        worker = start_native_thread(run, name="tokenrails-outlines-stream")
        tokenizer = self.model.hf_tokenizer
        ids: list[list[int]] | None = None
        texts: list[str] = []
        try:
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
        finally:  # a consumer that stops early (break, close) stops the generation at its next step
            streamer.closed.set()
            worker.join()
        if failure:
            raise failure[0]


def _no_more_arguments(model_specific_params: dict) -> None:
    """outlines' own loop takes no transformers arguments: refuse them rather than drop them."""
    if model_specific_params:
        raise TypeError(f"outlines' token loop (0.0.x API, or a sampler of outlines' own protocol) takes no "
                        f"{', '.join(sorted(model_specific_params))}")


def _first_accepting_state_ends() -> bool:
    """outlines 0.0.x (``api_version``): ``generate.*`` ran outlines' own loop, which ends once every
    sequence's guide is in a final state — so the shim runs that loop too."""
    from .._api_version import stops_at_first_accepting_state

    return stops_at_first_accepting_state()


class _StreamClosed(Exception):
    """The stream's consumer went away: raised in the generation thread to end it."""


class _StepStreamer:
    """transformers' streamer protocol: ``put`` gets the prompt ids once, then each step's new ids."""

    def __init__(self, steps: "queue.Queue[list[int] | None]"):
        self.steps = steps
        self.prompt_seen = False
        self.closed = threading.Event()

    def put(self, value: torch.Tensor) -> None:
        if self.closed.is_set():
            raise _StreamClosed
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.steps.put(value.reshape(-1).tolist())

    def end(self) -> None:
        pass


class SequenceGenerator:
    """outlines 0.x's own loop over ``model(token_ids, attention_masks, kv_cache) -> (logits,
    kv_cache)`` with one FSM copy per row (``sequence_generator``). For code that built it by hand
    (custom FSMs or samplers); ``generate.*`` return the transformers-backed adapter instead."""

    def __init__(self, fsm: Any, model: Any, sampler: Any, device: Any):
        self.fsm = fsm
        self.model = model
        self.sampler = sampler
        self.tokenizer = model.tokenizer
        self.device = device
        self.num_samples = getattr(sampler, "samples", 1)

    def format_sequence(self, sequence: str) -> Any:
        return sequence

    def _start(self, prompts: List[str], rng: Optional[torch.Generator]) -> tuple[Iterator[Any], torch.Tensor]:
        from .generator import sequence_generator

        token_ids, attention_masks = self.tokenizer.encode(prompts)
        token_ids = token_ids.to(self.device).repeat_interleave(self.num_samples, dim=0)
        attention_masks = attention_masks.to(self.device).repeat_interleave(self.num_samples, dim=0)
        rows = token_ids.shape[0]
        fsm_states = [0] * rows
        fsms = [self.fsm.copy() for _ in range(rows)]
        weights = torch.zeros(rows, dtype=torch.float, device=self.device)
        if rng is None:
            rng = torch.Generator(device=self.device)
            rng.seed()
        states = sequence_generator(self.model, self.sampler, fsms, token_ids, weights, attention_masks,
                                    fsm_states, rng=rng)
        return states, token_ids

    def _generated(self, prompt_ids: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        return token_ids[:, prompt_ids.shape[1]:]

    def __call__(self, prompts: Union[str, List[str]], max_tokens: Optional[int] = None,
                 stop_at: Optional[Union[str, List[str]]] = None, rng: Optional[torch.Generator] = None) -> Any:
        single = isinstance(prompts, str)
        prompts = [prompts] if single else list(prompts)
        stops = [stop_at] if isinstance(stop_at, str) else list(stop_at or [])
        states, prompt_ids = self._start(prompts, rng)
        last = None
        for count, state in enumerate(states, start=1):
            last = state
            if max_tokens is not None and count >= max_tokens:
                break
            if stops and all(any(s in t for s in stops)
                             for t in self.tokenizer.decode(self._generated(prompt_ids, state.token_ids))):
                break
        if last is None:
            return "" if single else ["" for _ in prompts]
        texts = self.tokenizer.decode(self._generated(prompt_ids, last.token_ids))
        texts = [self.format_sequence(_strip_stop(t, stops)) for t in texts]
        n = self.num_samples
        output: list = [texts[i * n:(i + 1) * n] for i in range(len(prompts))]
        if n == 1:
            output = [group[0] for group in output]
        return output[0] if single else output

    def stream(self, prompts: Union[str, List[str]], max_tokens: Optional[int] = None,
               stop_at: Optional[Union[str, List[str]]] = None,
               rng: Optional[torch.Generator] = None) -> Iterator[Any]:
        """The new token's text per step: a ``str`` for one prompt and one sample, else a list
        (a list of lists with several samples per prompt)."""
        single = isinstance(prompts, str)
        prompts = [prompts] if single else list(prompts)
        stops = [stop_at] if isinstance(stop_at, str) else list(stop_at or [])
        states, prompt_ids = self._start(prompts, rng)
        previous: Optional[List[str]] = None
        for count, state in enumerate(states, start=1):
            texts = self.tokenizer.decode(self._generated(prompt_ids, state.token_ids))
            old = previous or ["" for _ in texts]
            pieces = [t[len(o):] if t.startswith(o) else t for t, o in zip(texts, old)]
            previous = texts
            n = self.num_samples
            grouped = [pieces[i * n:(i + 1) * n] for i in range(len(prompts))]
            yield grouped[0][0] if single and n == 1 else (grouped if n > 1 else [g[0] for g in grouped])
            if max_tokens is not None and count >= max_tokens:
                return
            if stops and all(any(s in t for s in stops) for t in texts):
                return


def _strip_stop(text: str, stops: List[str]) -> str:
    """The text up to and including the first stop sequence it contains."""
    for stop in stops:
        at = text.find(stop)
        if at >= 0:
            text = text[:at + len(stop)]
    return text
