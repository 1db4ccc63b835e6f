"""``outlines.processors``: logits processors with outlines' names and constructor signatures."""
from .base_logits_processor import BaseLogitsProcessor, OutlinesLogitsProcessor
from .structured import (
    CFGLogitsProcessor,
    GuideLogitsProcessor,
    JSONLogitsProcessor,
    RegexLogitsProcessor,
)

__all__ = [
    "BaseLogitsProcessor",
    "CFGLogitsProcessor",
    "GuideLogitsProcessor",
    "JSONLogitsProcessor",
    "OutlinesLogitsProcessor",
    "RegexLogitsProcessor",
]
