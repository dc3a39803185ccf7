"""The torch-facing Communicator, its engines' shared plan choice, the torch ops and the engine plugin API."""
