# The course in JupyterLab, for a classroom machine or a student's laptop:
#   docker build -t tinytrain . && docker run -p 8888:8888 tinytrain
# then open the http://127.0.0.1:8888/lab?token=... address it prints.
FROM python:3.11-slim
RUN useradd --create-home student
WORKDIR /home/student/tinytrain
COPY --chown=student:student . .
# Editable, so that `tinytrain export NN` writes the student's code into this package.
RUN pip install --no-cache-dir -e '.[notebooks]'
USER student
EXPOSE 8888
CMD ["jupyter", "lab", "--ip=0.0.0.0", "--port=8888", "--no-browser", "notebooks/"]
