"""How payloads are written and read: the pydantic payload converter every data
converter shares (`converter`), their encryption (`encryption`),
`turnkeeper codec-server`, which decrypts them for the Temporal UI
(`codec_server`), and the raw signal payloads the workflow's handlers read
themselves, so a malformed one is refused in words (`raw`)."""
