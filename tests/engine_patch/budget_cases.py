"""The record-extraction request both adapters' budget tests close (the demo's schema without the
integer bounds the fsm lowering does not enforce, plus a free-length list to run out of tokens in)."""

SCHEMA = {
    "type": "object",
    "properties": {
        "customer_name": {"type": "string"},
        "account_status": {"enum": ["active", "inactive"]},
        "age": {"type": "integer"},
        "notes": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["customer_name", "account_status", "age", "notes"],
}
PROMPT = "Extract the customer record as JSON: Maria Lopez, 34 years old, her account is active."
