# The kube-ddp operator image: the kube_ddp package and its CLI; `kube-ddp operator` runs it.
#   buildah bud -t kube-ddp-operator .     (or docker build; docs/install.md)
# Two stages: the build stage makes a virtual environment, the final one holds only that venv
# (no pip, no build context) on the same slim Python, run as a non-root user. It runs with a
# read-only root filesystem: nothing is written but to /tmp (an emptyDir in the chart).
ARG PYTHON_IMAGE=python:3.12.12-slim-trixie

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY trainer_image/pyproject.toml trainer_image/README.md* trainer_image/
COPY trainer_image/ddp_trainer trainer_image/ddp_trainer
COPY trainer_image/horovod trainer_image/horovod
COPY operator/pyproject.toml operator/
COPY operator/kube_ddp operator/kube_ddp
# The operator imports only the trainer's options model (pydantic): the trainer goes in without
# its dependencies (numpy, torch), which the operator never runs, so the operator's own
# dependencies are read from its pyproject.toml and both packages are installed without theirs.
# Then pip, the trainer's console script and the activate scripts leave the venv.
RUN python3 -m venv /opt/kube-ddp \
    && python3 -c "import tomllib; deps = tomllib.load(open('operator/pyproject.toml', 'rb'))['project']['dependencies']; print('\n'.join(d for d in deps if not d.startswith('ddp-trainer')))" > /tmp/requirements.txt \
    && /opt/kube-ddp/bin/pip install -r /tmp/requirements.txt \
    && /opt/kube-ddp/bin/pip install --no-deps ./trainer_image ./operator \
    && /opt/kube-ddp/bin/pip uninstall --yes pip \
    && rm /opt/kube-ddp/bin/ddp-train /opt/kube-ddp/bin/[Aa]ctivate* \
    && /opt/kube-ddp/bin/kube-ddp --help > /dev/null

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="kube-ddp-operator" \
      org.opencontainers.image.description="The kube-ddp operator: PyTorch DDP training jobs on Kubernetes" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/kube-ddp/kube-ddp" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/kube-ddp/bin:$PATH
COPY --from=build /opt/kube-ddp /opt/kube-ddp
# A passwd entry: kopf asks getpass.getuser() for its identity.
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin kubeddp
USER 10001:10001
WORKDIR /tmp
# 8080 /healthz and /readyz, 8081 /metrics
EXPOSE 8080 8081
ENTRYPOINT ["kube-ddp"]
CMD ["operator", "--all-namespaces"]
