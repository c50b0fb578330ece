"""The API-server adapter: the only gpushare code that talks to kube-apiserver."""
