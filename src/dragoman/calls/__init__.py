"""What a call is: `Call`, `Route`, `Reply`, `Outcome` and the `Backend` interface, shared by
the backends and everything above them."""
