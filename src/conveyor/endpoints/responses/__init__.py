"""OpenAI's Responses API (``/v1/responses``) on the chat path, without HTTP.

``schemas`` and ``item_schemas`` hold the request body; ``items`` turns its input items
(and a stored conversation) into chat messages and the rest of the body into a chat
request; ``events`` builds the output items and the streamed events from the engine's
text; ``run`` prepares and runs one response; ``stored`` keeps responses in the job store
per tenant (``previous_response_id``, retrieval, input items, deletion, background runs).
"""
