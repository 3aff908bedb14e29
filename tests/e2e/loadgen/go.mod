module assaywatch/loadgen

go 1.22
