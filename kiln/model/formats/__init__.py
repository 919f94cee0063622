"""Every weight format Kiln reads or writes, in kiln's parameter names: Hugging Face folders
(`hf`, names in `hf_names`, config.json fields in `hf_config`), GGUF files (`gguf`,
`gguf_writer`; their vocabularies in `gguf_tokenizer` and `gguf_spm_tokenizer`), PEFT LoRA
adapters (`peft`), the Kiln checkpoint layout for weights (`checkpoint` over DCP `storage` and
the non-pickling `safe_reader`; `adapter_checkpoint` for LoRA runs), and
`weights.read_weights`, which reads whichever of them a path holds."""
