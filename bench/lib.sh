# Helpers shared by bench/run.sh, bench/ab.sh and bench/cluster.sh (sourced, not run).

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

wait_ready() { # port seconds: until GET /readyz answers 200
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    [ "$(curl -s -o /dev/null -m 2 -w '%{http_code}' "http://127.0.0.1:$1/readyz")" = 200 ] && return 0
    sleep 0.1
  done
  return 1
}

stop_pids() { # pid...: SIGTERM, up to 10 s for them to exit, then SIGKILL
  local p i
  [ $# -gt 0 ] || return 0
  kill "$@" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    for p in "$@"; do kill -0 "$p" 2>/dev/null && break; p=""; done
    [ -z "$p" ] && break
    sleep 0.1
  done
  kill -9 "$@" 2>/dev/null || true
  for p in "$@"; do wait "$p" 2>/dev/null || true; done
}
