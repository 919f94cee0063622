"""Post-training: chat/instruction/preference data, chat templates, packing, SFT and DPO
objectives. LoRA lives beside the model (kiln/model/lora.py); the trainer is the same one
pretraining uses (SFT and DPO are objectives and data formats, not a second trainer).

Nothing here imports torch at package import time.
"""
