-- Quitting while commands run asks first (contract §8.4), as `:terminal` jobs do: while any run is
-- unfinished, a hidden buffer `agent-bash://running` is 'modified', so `:qa`, `:q` in the last
-- window and `ZZ` stop with "E162: No write since last change for buffer
-- "agent-bash://running"" (`:confirm qa` asks) and show that buffer, which lists the running
-- commands and what to do. `:qa!` quits and the backend stops the commands. Writing it (`:wqa`)
-- is refused the same way.

local M = {}
local H = {}

M.NAME = 'agent-bash://running'

--- Sets the guard for the unfinished runs (none lifts it).
---@param runs agent_bash.Run[]
function M.update(runs)
  if #runs == 0 and not (H.buf and vim.api.nvim_buf_is_valid(H.buf)) then
    return
  end
  local buf = H.ensure()
  local lines
  if #runs == 0 then
    lines = { 'agent-bash: no command is running; :qa quits.' }
  else
    lines = {
      ('agent-bash: %d command%s running. :qa! quits and stops %s; :AgentBashCancel cancels the newest bang command.'):format(
        #runs,
        #runs == 1 and '' or 's',
        #runs == 1 and 'it' or 'them'
      ),
      '',
    }
    for _, run in ipairs(runs) do
      lines[#lines + 1] = ('%s  $ %s'):format(run.state.origin, run.state.command:match('^[^\n]*'))
    end
  end
  vim.bo[buf].modifiable = true
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, lines)
  vim.bo[buf].modifiable = false
  vim.bo[buf].modified = #runs > 0
end

--- Whether the guard holds (some run is unfinished).
---@return boolean
function M.active()
  return H.buf ~= nil and vim.api.nvim_buf_is_valid(H.buf) and vim.bo[H.buf].modified
end

-- Helpers -----------------------------------------------------------------------------------

function H.ensure()
  if H.buf and vim.api.nvim_buf_is_valid(H.buf) then
    return H.buf
  end
  local buf = vim.api.nvim_create_buf(false, true)
  -- 'acwrite': a buffer Neovim checks for changes on quit (a 'nofile' one it does not). Named
  -- once: renaming would leave the old name behind as an alternate buffer.
  vim.bo[buf].buftype = 'acwrite'
  vim.bo[buf].bufhidden = 'hide'
  vim.bo[buf].swapfile = false
  pcall(vim.api.nvim_buf_set_name, buf, M.NAME)
  vim.api.nvim_create_autocmd('BufWriteCmd', {
    buffer = buf,
    desc = 'agent-bash: commands are running; nothing to write',
    callback = function()
      vim.notify('agent-bash: commands are still running; :qa! stops them', vim.log.levels.WARN)
    end,
  })
  H.buf = buf
  return buf
end

return M
