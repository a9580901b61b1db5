"""The one error the contracts raise."""


class ContractError(ValueError):
    """Data that does not fit its contract (a manifest that fails validation, a record with an unknown key)."""
