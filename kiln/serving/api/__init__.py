"""The REST APIs the endpoint serves: one package per API, the shared pieces here."""
