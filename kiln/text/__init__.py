"""Text in and out of a model: its tokenizer (loading, the files that travel with it, its
end-of-text token) and its chat template, rendered as `transformers` renders it."""
