from tests.gateway.conftest import store_url  # noqa: F401  (fixture)
