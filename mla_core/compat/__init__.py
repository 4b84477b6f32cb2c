"""Drop-in surfaces of other libraries' APIs backed by mla_core (``mla_core.compat.flashinfer``)."""
