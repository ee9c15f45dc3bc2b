"""gpuchef as a client of an OpenAI-compatible server: the HTTP load client
(``gpuchef bench --base-url URL``, :mod:`gpuchef.client.http_load`)."""
