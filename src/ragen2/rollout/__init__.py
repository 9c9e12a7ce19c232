"""Rollout backends behind one Sampler protocol: hf (CPU / one GPU), scripted (tests)."""

from ragen2.rollout.base import PromptMeta, Sample, Sampler, SamplingParams
from ragen2.rollout.vllm import VLLMSampler  # vllm itself is imported when the engine starts

__all__ = ["PromptMeta", "Sample", "Sampler", "SamplingParams", "VLLMSampler"]
