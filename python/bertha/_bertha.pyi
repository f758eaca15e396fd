"""The Rust extension: thin classes over the bertha library (see __init__)."""

from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import numpy.typing as npt

__version__: str

class Embedder:
    def __init__(
        self,
        path: str,
        precision: str = "float32",
        pooling: Optional[str] = None,
        normalize: Optional[bool] = None,
        max_seq_length: Optional[int] = None,
    ) -> None: ...
    def encode(
        self,
        texts: List[str],
        batch_size: int = 32,
        prompt_name: Optional[str] = None,
        prompt: Optional[str] = None,
        truncate_dim: Optional[int] = None,
        normalize: bool = False,
        precision: Optional[str] = None,
        progress: Optional[Any] = None,
    ) -> npt.NDArray[np.float32]: ...
    def embed_tokens(self, texts: List[str], batch_size: int = 32) -> List[npt.NDArray[np.float32]]: ...
    @property
    def dimension(self) -> int: ...
    @property
    def max_seq_length(self) -> int: ...
    @property
    def normalizes(self) -> bool: ...
    @property
    def prompts(self) -> Dict[str, str]: ...
    @property
    def default_prompt_name(self) -> Optional[str]: ...
    @property
    def similarity_fn_name(self) -> Optional[str]: ...
    @property
    def precision(self) -> str: ...
    @property
    def path(self) -> str: ...

class FillMask:
    def __init__(self, path: str, precision: str = "float32") -> None: ...
    def fill(self, text: str, top_k: int = 5) -> List[List[Dict[str, Any]]]: ...
    @property
    def mask_token(self) -> str: ...

class TextClassifier:
    def __init__(self, path: str, precision: str = "float32") -> None: ...
    def classify(
        self,
        text: str,
        text_pair: Optional[str] = None,
        top_k: Optional[int] = None,
        function_to_apply: Optional[str] = None,
    ) -> List[Dict[str, Any]]: ...
    def classify_many(
        self,
        inputs: List[Tuple[str, Optional[str]]],
        top_k: Optional[int] = None,
        function_to_apply: Optional[str] = None,
    ) -> List[List[Dict[str, Any]]]: ...
    @property
    def labels(self) -> List[str]: ...

class TokenClassifier:
    def __init__(self, path: str, precision: str = "float32") -> None: ...
    def entities(self, text: str, aggregation: str = "none") -> List[Dict[str, Any]]: ...
    def entities_many(
        self, texts: List[str], aggregation: str = "none"
    ) -> List[List[Dict[str, Any]]]: ...

class QuestionAnswerer:
    def __init__(self, path: str, precision: str = "float32") -> None: ...
    def answer(
        self,
        question: str,
        context: str,
        top_k: int = 1,
        max_answer_len: int = 15,
        doc_stride: Optional[int] = None,
        max_seq_len: Optional[int] = None,
    ) -> List[Dict[str, Any]]: ...

class CrossEncoder:
    def __init__(
        self,
        path: str,
        precision: str = "float32",
        max_length: Optional[int] = None,
        batch_size: int = 32,
    ) -> None: ...
    def predict(
        self, firsts: List[str], seconds: List[str], activation: Optional[str] = None
    ) -> npt.NDArray[np.float32]: ...
    def rank(self, query: str, documents: List[str], top_k: Optional[int] = None) -> List[Dict[str, Any]]: ...
    @property
    def num_labels(self) -> int: ...
    @property
    def max_length(self) -> int: ...

def train(
    task: str,
    model: str,
    train: Any,
    out: Any,
    dev: Optional[Any] = None,
    options: Optional[Dict[str, Any]] = None,
    on_event: Optional[Callable[[str, Dict[str, Any]], None]] = None,
) -> Dict[str, Any]: ...
