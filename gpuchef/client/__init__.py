"""The HTTP load client: gpuchef's load sent to any OpenAI-compatible server (`bench --base-url`)."""
