"""``bertha.pipeline``: transformers' ``pipeline(task, model=...)`` call and
output shapes, over the library's task pipelines."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple, Union



from . import _bertha

TASKS = (
    "fill-mask",
    "text-classification",
    "token-classification",
    "question-answering",
    "feature-extraction",
)
# transformers' aliases of the same pipelines.
ALIASES = {
    "sentiment-analysis": "text-classification",
    "ner": "token-classification",
}


class Pipeline:
    task: str = ""

    def __call__(self, inputs: Any, **kwargs: Any) -> Any:
        # One input gives one result, a list gives a list: as transformers.
        if isinstance(inputs, list):
            return [self._one(x, **kwargs) for x in inputs]
        return self._one(inputs, **kwargs)

    def _one(self, inputs: Any, **kwargs: Any) -> Any:  # pragma: no cover
        raise NotImplementedError


class FillMaskPipeline(Pipeline):
    task = "fill-mask"

    def __init__(self, model: str, precision: str = "float32", top_k: int = 5) -> None:
        self._m = _bertha.FillMask(model, precision=precision)
        self.top_k = top_k

    def _one(self, text: str, top_k: Optional[int] = None) -> Any:
        masks = self._m.fill(text, top_k=top_k or self.top_k)
        # transformers: a text with one mask gives its list of predictions.
        return masks[0] if len(masks) == 1 else masks


class TextClassificationPipeline(Pipeline):
    task = "text-classification"

    def __init__(
        self,
        model: str,
        precision: str = "float32",
        top_k: Optional[int] = 1,
        function_to_apply: Optional[str] = None,
    ) -> None:
        self._m = _bertha.TextClassifier(model, precision=precision)
        self.top_k = top_k
        self.function_to_apply = function_to_apply

    def __call__(self, inputs: Any, **kwargs: Any) -> Any:
        top_k = kwargs.get("top_k", self.top_k)
        if isinstance(inputs, list):
            # Many at once: batched, the batches side by side on the cores.
            out = self._m.classify_many(
                [self._text_and_pair(x) for x in inputs],
                top_k=top_k,
                function_to_apply=kwargs.get("function_to_apply") or self.function_to_apply,
            )
            # transformers: with top_k=1 each input gives its best label.
            return [r[0] for r in out] if top_k == 1 else out
        return self._one(inputs, **kwargs)

    @staticmethod
    def _text_and_pair(inputs: Union[str, Dict[str, str]]) -> Tuple[str, Optional[str]]:
        if isinstance(inputs, dict):
            return inputs["text"], inputs.get("text_pair")
        return inputs, None

    def _one(
        self,
        inputs: Union[str, Dict[str, str]],
        top_k: Any = "default",
        function_to_apply: Optional[str] = None,
    ) -> List[Dict[str, Any]]:
        text, pair = self._text_and_pair(inputs)
        k = self.top_k if top_k == "default" else top_k
        return self._m.classify(
            text,
            text_pair=pair,
            top_k=k,
            function_to_apply=function_to_apply or self.function_to_apply,
        )


class TokenClassificationPipeline(Pipeline):
    task = "token-classification"

    def __init__(
        self, model: str, precision: str = "float32", aggregation_strategy: str = "none"
    ) -> None:
        self._m = _bertha.TokenClassifier(model, precision=precision)
        self.aggregation_strategy = aggregation_strategy

    def __call__(self, inputs: Any, **kwargs: Any) -> Any:
        if isinstance(inputs, list):
            # Many at once: batched, the batches side by side on the cores.
            agg = kwargs.get("aggregation_strategy") or self.aggregation_strategy
            return self._m.entities_many(inputs, aggregation=agg)
        return self._one(inputs, **kwargs)

    def _one(self, text: str, aggregation_strategy: Optional[str] = None) -> List[Dict[str, Any]]:
        return self._m.entities(text, aggregation=aggregation_strategy or self.aggregation_strategy)


class QuestionAnsweringPipeline(Pipeline):
    task = "question-answering"

    def __init__(self, model: str, precision: str = "float32") -> None:
        self._m = _bertha.QuestionAnswerer(model, precision=precision)

    def __call__(  # type: ignore[override]
        self,
        question: Optional[str] = None,
        context: Optional[str] = None,
        top_k: int = 1,
        max_answer_len: int = 15,
        doc_stride: Optional[int] = None,
        max_seq_len: Optional[int] = None,
    ) -> Any:
        if question is None or context is None:
            raise ValueError("question-answering needs question= and context=")
        answers = self._m.answer(
            question,
            context,
            top_k=top_k,
            max_answer_len=max_answer_len,
            doc_stride=doc_stride,
            max_seq_len=max_seq_len,
        )
        return answers[0] if top_k == 1 and answers else answers


class FeatureExtractionPipeline(Pipeline):
    task = "feature-extraction"

    def __init__(self, model: str, precision: str = "float32") -> None:
        self._m = _bertha.Embedder(model, precision=precision, pooling="none")

    def _one(self, text: str, return_tensors: bool = False) -> Any:
        (tokens,) = self._m.embed_tokens([text])
        # transformers: a batch of one, [1, tokens, hidden].
        return tokens[None] if return_tensors else [tokens.tolist()]


_CLASSES = {
    "fill-mask": FillMaskPipeline,
    "text-classification": TextClassificationPipeline,
    "token-classification": TokenClassificationPipeline,
    "question-answering": QuestionAnsweringPipeline,
    "feature-extraction": FeatureExtractionPipeline,
}


def pipeline(task: str, model: Union[str, "os.PathLike[str]"], **kwargs: Any) -> Pipeline:
    """transformers' ``pipeline(task, model=path)`` for a local model folder:
    ``fill-mask``, ``text-classification`` (``sentiment-analysis``),
    ``token-classification`` (``ner``), ``question-answering`` or
    ``feature-extraction``. Keyword arguments: ``precision`` and the task's
    own (``top_k``, ``function_to_apply``, ``aggregation_strategy``)."""
    name = ALIASES.get(task, task)
    if name not in _CLASSES:
        raise ValueError(f"task `{task}` is not one of {', '.join(TASKS)}")
    return _CLASSES[name](os.fspath(model), **kwargs)


__all__ = ["pipeline", "Pipeline", "TASKS"] + [c.__name__ for c in _CLASSES.values()]
