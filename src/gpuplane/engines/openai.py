"""Any OpenAI-compatible server gpuplane does not launch: health on /health, no load metrics."""

from gpuplane.engines.base import EngineAdapter, register


@register
class OpenAICompatible(EngineAdapter):
    name = "openai"
