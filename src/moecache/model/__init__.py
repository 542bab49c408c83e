"""The model under study: loading any OLMoE checkpoint, training the embedded one."""
