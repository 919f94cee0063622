"""The OpenAI API: completions and chat completions."""
