"""Speculative decoding on tokenrails: grammar drafts, adaptive verification, EAGLE, counters."""
