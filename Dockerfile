# The kube-ddp operator image: the kube_ddp package and its CLI; `kube-ddp operator` runs it.
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY trainer_image/pyproject.toml trainer_image/README.md* trainer_image/
COPY trainer_image/ddp_trainer trainer_image/ddp_trainer
COPY operator/pyproject.toml operator/
COPY operator/kube_ddp operator/kube_ddp
# The operator needs only the trainer's options model, never torch.
RUN pip install ./trainer_image ./operator \
    && useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin kubeddp
USER 10001
WORKDIR /
# 8080 /healthz (liveness), 8081 /metrics
EXPOSE 8080 8081
ENTRYPOINT ["kube-ddp"]
CMD ["operator", "--all-namespaces"]
