holdpoint-signature 1
algorithm ed25519
key-id 8a9b5b8296fd381aed779e9d12ec02a0
file a.pt
size 14244
sha256 99b988e53aa20fea19e27ede3e372576489737afc9a468faee9657099c9debdd
step -
config-identity -
pr