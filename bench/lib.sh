# Helpers shared by bench/run.sh and bench/ab.sh (sourced, not run).

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

free_port() { # first port from $1 on that nothing listens on
  local p=$1
  while port_busy "$p"; do p=$((p + 1)); done
  echo "$p"
}

wait_port() { # port seconds
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    port_busy "$1" && return 0
    sleep 0.1
  done
  return 1
}

write_nginx_conf() { # work-dir port: nginx answering 202 to everything, the HTTP ceiling
  mkdir -p "$1/logs"
  cat >"$1/nginx.conf" <<NGINX
worker_processes auto;
pid $1/nginx.pid;
error_log $1/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000000;
  keepalive_timeout 300s;
  client_body_buffer_size 64k;
  client_max_body_size 16m;
  client_body_temp_path $1/body;
  proxy_temp_path $1/proxy;
  fastcgi_temp_path $1/fastcgi;
  uwsgi_temp_path $1/uwsgi;
  scgi_temp_path $1/scgi;
  server {
    listen 127.0.0.1:$2 reuseport backlog=4096;
    location / { return 202; }
  }
}
NGINX
}
