"""The decode explorer: step through a decode forward by forward, several models side by side.

``trace``   a traced reference decode -> one frame per forward (canvas, commits, entropy, residual norm, TPF)
``page``    the self-contained HTML page (inline CSS/JS, no network at view time)
``cli``     `orl explore` (and `orl explore plot`); ``route``: GET /explore on `orl serve --explore`
``plots``   PNGs beside the JSON people would otherwise read: frontiers, training curves, engine profiles
``browser`` headless Chromium over the DevTools pipe (the browser test, ``--screenshot``)

Does not own: decoding (`orl.decode`), the models' loading (`orl.serve.llm.LLM`), verification
(`orl.eval.pool`). Importing this package imports nothing heavy; each module imports what it uses.
"""
