"""Writers: a tree saved as .pth (torch zip) or .safetensors, streamed, atomic and verified."""
