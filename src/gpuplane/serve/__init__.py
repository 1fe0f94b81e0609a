"""Online inference: the OpenAI-compatible gateway and the engines behind it."""
