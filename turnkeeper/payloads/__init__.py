"""How payloads are written and read outside workflow code: the pydantic payload
converter every data converter shares (`converter`), their encryption
(`encryption`), and `turnkeeper codec-server`, which decrypts them for the
Temporal UI (`codec_server`)."""
